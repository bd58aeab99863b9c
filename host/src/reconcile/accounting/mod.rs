//! The Accounting reconciler: slurmdbd's StatefulSet, Service and `slurmdbd.conf` Secret
//! (`accounting-children` builder), applied through the one child path ([`super::core::apply`]); status
//! conditions and `observedGeneration`. Controllers that reference an Accounting take its address
//! for their `AccountingStorage*` lines ([`super::controller`]).
//!
//! # Guarantees
//! * The builder gets a copy of the Accounting and hashes of its key Secrets and of its stored
//!   `slurmdbd.conf`: never a Secret's data. The database password is written into
//!   `slurmdbd.conf` here, by the host, where the builder placed the placeholder of
//!   `spec.storageConfig.passwordKeyRef` (the output policy lets it place no other Secret value).
//!   A password with a line break is refused (`InvalidSpec`): it would add lines to the file.
//! * A missing key or password Secret (or key) is `ReferenceNotFound`: the children wait (the
//!   existing ones stay), retried with backoff.
//! * A changed `slurmdbd.conf` rolls slurmdbd: its hash is on the pod template, and a pass that
//!   writes a new one comes back within a second to apply the template that carries it. A new
//!   Accounting's StatefulSet waits for that pass (slurmdbd starts once, on its configuration;
//!   Slinky's starts before its Secret exists, then rolls).
//! * slurmdbd's StatefulSet goes with the Accounting (or when it turns external), never because a
//!   build left it out.

use crate::plugins::Builder as _;
use std::{collections::BTreeSet, sync::Arc, time::Duration};

use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use slinky_api::{
    Accounting, AccountingStatus, checks, conditions,
    contract::{AccountingInputs, MissingReference, secret_hash, secret_refs},
};

use super::{
    ControllerContext, Error, component, core::apply::ChildSync, core::backoff, core::pass::PassState,
};
use crate::plugins::{BuilderKind, Child, ChildKind};

/// The kinds of an Accounting's built children that pruning looks at (its Secret is not cached:
/// it goes with the Accounting).
const CHILD_KINDS: [ChildKind; 2] = [ChildKind::Service, ChildKind::StatefulSet];

/// How soon a pass that wrote a new `slurmdbd.conf` comes back to roll slurmdbd.
const ROLL_AFTER_CONF: Duration = Duration::from_secs(1);

/// Reconcile one Accounting.
///
/// # Errors
/// API errors (retried with the Accounting's backoff by the error policy).
pub async fn reconcile(a: Arc<Accounting>, ctx: Arc<ControllerContext>) -> Result<Action, Error> {
    ctx.core.instrumented(a.as_ref(), reconcile_inner(&a, &ctx)).await
}

/// What stops a pass before the builder runs: `(reason, message)` of `ReferenceNotFound`.
type Missing = (&'static str, String);

async fn reconcile_inner(a: &Accounting, ctx: &ControllerContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    let ns = a.namespace().unwrap_or_default();
    if a.metadata.deletion_timestamp.is_some() || !core.serves(&ns) {
        return Ok(Action::await_change());
    }
    let current = a
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut state = PassState::new(core, a, current);
    let mut sync = ChildSync::new(
        core,
        &ctx.caches.children,
        &ctx.applied,
        a,
        current,
        BTreeSet::new(),
    );
    let mut applied = Vec::new();
    let mut missing: Option<Missing> = None;
    let mut roll_soon = false;
    if let Some(problem) = checks::summary(&a.spec_problems()) {
        state.problem(conditions::INVALID_SPEC, problem).await;
    } else {
        match read_inputs(ctx, a).await? {
            Err(m) => missing = Some(m),
            Ok((inputs, password)) => {
                let stored_hash = inputs.slurmdbd_conf_hash.clone();
                let copy = a.clone();
                let built = core
                    .call_builder(
                        BuilderKind::AccountingChildren,
                        a.labels(),
                        move |plugin, build| plugin.build_accounting_children(build, &copy, &inputs),
                    )
                    .await?;
                match built.map(|children| with_secret_values(children, a, password.as_deref())) {
                    Ok(Ok(mut desired)) => {
                        roll_soon = desired
                            .iter()
                            .filter(|c| c.kind == ChildKind::Secret)
                            .any(|c| hash_of(c) != stored_hash);
                        // No slurmdbd.conf stored yet: slurmdbd waits for it (its pod would not
                        // mount, and would roll once the hash of the new Secret is known).
                        if stored_hash.is_empty() && roll_soon {
                            desired.retain(|c| c.kind != ChildKind::StatefulSet);
                        }
                        let kept: &[ChildKind] = if a.spec.external {
                            &[]
                        } else {
                            &[ChildKind::StatefulSet]
                        };
                        applied = component::apply_and_prune(&mut sync, desired, &CHILD_KINDS, kept).await?;
                    }
                    Ok(Err(message)) => state.problem(conditions::INVALID_SPEC, message).await,
                    Err(e) => state.builder_error(&e).await,
                }
            }
        }
    }
    if let Some((reason, message)) = &missing {
        if !super::core::status::ConditionChanges::already_true(
            current,
            conditions::REFERENCE_NOT_FOUND,
            message,
        ) {
            tracing::warn!(reason, "{message}");
            core.event(a, EventType::Warning, reason, message.clone()).await;
        }
        state.problem = Some((conditions::REFERENCE_NOT_FOUND, message.clone()));
    }
    let failures = sync.finish();
    let retry = !failures.is_empty() || state.builder_failed || missing.is_some();
    component::set_conditions(
        &mut state,
        &[
            conditions::INVALID_SPEC,
            conditions::BUILDER_FAILED,
            conditions::REFERENCE_NOT_FOUND,
        ],
        &failures,
        &applied,
        readiness(ctx, a),
    );
    if let Some((reason, message)) = &missing {
        state
            .conditions
            .set(conditions::REFERENCE_NOT_FOUND, true, reason, message.clone());
        state
            .conditions
            .set(conditions::READY, false, reason, message.clone());
    }
    let changes = state.conditions.clone();
    let generation = a.metadata.generation;
    component::write_status(
        core,
        a,
        move |obj: &Accounting| AccountingStatus {
            observed_generation: generation,
            conditions: changes.apply(
                obj.status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
            ),
        },
        |obj: &Accounting| obj.status.clone(),
    )
    .await?;
    let requeue = core
        .backoff
        .record(&backoff::key(a), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync);
    Ok(Action::requeue(if roll_soon && failures.is_empty() {
        requeue.min(ROLL_AFTER_CONF)
    } else {
        requeue
    }))
}

/// slurmdbd's readiness, as its StatefulSet reports it (none for an external Accounting).
fn readiness(ctx: &ControllerContext, a: &Accounting) -> Option<String> {
    if a.spec.external {
        return Some("external: slurmdbd runs elsewhere".into());
    }
    let key = ObjectRef::new(&a.accounting_key()).within(&a.namespace().unwrap_or_default());
    let sts = ctx.caches.children.statefulsets.get(&key)?;
    let ready = sts.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    Some(format!("slurmdbd {ready}/1 ready"))
}

/// The hash of a built Secret's data, as Slinky hashes the stored one.
fn hash_of(child: &Child) -> String {
    serde_json::from_value::<Secret>(child.object.clone())
        .map(|s| secret_hash(&s))
        .unwrap_or_default()
}

/// What the builder needs (the key hashes and the stored `slurmdbd.conf`'s) and the database
/// password, read from the API by name; or the first missing reference.
async fn read_inputs(
    ctx: &ControllerContext,
    a: &Accounting,
) -> Result<Result<(AccountingInputs, Option<String>), Missing>, Error> {
    let ns = a.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.core.client.clone(), &ns);
    if a.spec.external {
        return Ok(Ok((AccountingInputs::default(), None)));
    }
    let mut secrets = std::collections::BTreeMap::new();
    for r in a.key_secret_refs() {
        if !secrets.contains_key(&r.name)
            && let Some(s) = api.get_opt(&r.name).await?
        {
            secrets.insert(r.name.clone(), s);
        }
    }
    let stored = api.get_opt(&a.accounting_key()).await?;
    let (inputs, missing) = AccountingInputs::gather(a, |name| secrets.get(name), stored.as_ref());
    if let Some(m) = missing.first() {
        return Ok(Err((m.reason(), missing_message(&ns, m))));
    }
    let pass = &a.spec.storage_config.password_key_ref;
    let Some(secret) = api.get_opt(&pass.name).await? else {
        return Ok(Err((
            "SecretNotFound",
            format!(
                "Secret {ns}/{} (spec.storageConfig.passwordKeyRef) does not exist: slurmdbd's \
                 configuration waits for it",
                pass.name
            ),
        )));
    };
    let value = secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(&pass.key))
        .map(|v| v.as_bytes().to_vec())
        .or_else(|| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(&pass.key))
                .map(|ByteString(v)| v.clone())
        });
    let Some(value) = value else {
        return Ok(Err((
            "SecretKeyNotFound",
            format!(
                "Secret {ns}/{} (spec.storageConfig.passwordKeyRef) has no key {:?}: slurmdbd's \
                 configuration waits for it",
                pass.name, pass.key
            ),
        )));
    };
    Ok(Ok((inputs, Some(String::from_utf8_lossy(&value).into_owned()))))
}

/// The `ReferenceNotFound` message of a missing key reference of an Accounting of namespace `ns`.
fn missing_message(ns: &str, missing: &MissingReference) -> String {
    let what = match missing {
        MissingReference::Secret { field, name } => format!("Secret {ns}/{name} ({field}) does not exist"),
        MissingReference::SecretKey { field, name, key } => {
            format!("Secret {ns}/{name} ({field}) has no key {key:?}")
        }
        other => format!("{other:?}"),
    };
    format!("{what}: slurmdbd's StatefulSet and its configuration wait for it")
}

/// `children` with each Secret's placeholders replaced by the database password and its
/// `stringData` moved into `data` (as the API server stores it, so a steady state compares
/// equal); `Err` with the `InvalidSpec` message when the password cannot be placed.
fn with_secret_values(
    mut children: Vec<Child>,
    a: &Accounting,
    password: Option<&str>,
) -> Result<Vec<Child>, String> {
    let pass = &a.spec.storage_config.password_key_ref;
    for child in children.iter_mut().filter(|c| c.kind == ChildKind::Secret) {
        let Some(obj) = child.object.as_object_mut() else {
            continue;
        };
        let string_data = obj.remove("stringData").unwrap_or(Value::Null);
        let mut data = serde_json::Map::new();
        for (key, text) in string_data.as_object().into_iter().flatten() {
            let text = text.as_str().unwrap_or_default();
            let resolved = secret_refs::resolve(text, |r| {
                if r.name == pass.name && r.key == pass.key {
                    password
                        .map(String::from)
                        .ok_or_else(|| "no password was read".to_string())
                } else {
                    Err(format!(
                        "Secret {}/{} is not the Accounting's to place",
                        r.name, r.key
                    ))
                }
            })
            .map_err(|e| format!("spec.storageConfig.passwordKeyRef: {e}"))?;
            data.insert(key.clone(), Value::String(base64_encode(resolved.as_bytes())));
        }
        obj.insert("data".into(), Value::Object(data));
        obj.entry("type")
            .or_insert_with(|| Value::String("Opaque".into()));
    }
    Ok(children)
}

fn base64_encode(bytes: &[u8]) -> String {
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}
