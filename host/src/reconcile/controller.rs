//! The Controller reconciler: the slurmctld Service from the `controller-service` builder,
//! server-side applied; status conditions and `observedGeneration`.
//!
//! # Guarantees
//! * The Service is applied only over a Service this Controller controls (its controller owner
//!   reference has the Controller's UID) or created when none exists: a Service of that name the
//!   host did not build is never taken over (`ServiceFailure`, reason `ServiceNotOwned`).
//! * A steady state makes no writes: the Service is applied when it lacks something the builder
//!   wants, or when the builder's output changed since the last apply (the
//!   `slinky.slurm.net/applied-hash` annotation); fields and ports other managers added are no
//!   reason to apply again.
//! * Services this Controller controls that the host built and no longer wants (`external: true`,
//!   or named otherwise) are deleted, with a UID precondition.
//! * A refused write is an Event (`FailedApply`, `FailedDelete`) and a `ServiceFailure`
//!   condition, retried with the Controller's exponential backoff.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use slinky_api::{Controller, ControllerStatus, checks, conditions, keys};

use super::{
    Context, Error,
    compare::{contains, differences, dropped_note},
    object_key,
    status::ConditionChanges,
    writer,
};
use crate::plugins::{BuilderKind, GuestError, PluginError};

/// The annotation holding the hash of the Service as last applied by the host.
pub const ANNOTATION_APPLIED_HASH: &str = "slinky.slurm.net/applied-hash";

fn spec_problem(c: &Controller) -> Option<String> {
    if let Some(p) = checks::summary(&c.name_problems()) {
        return Some(p);
    }
    if c.spec.external {
        return c
            .spec
            .external_config
            .is_none()
            .then(|| "spec.externalConfig is required when spec.external is true".into());
    }
    if c.spec.slurm_key_ref.is_none() {
        return Some("spec.slurmKeyRef is required (the Secret holding the Slurm key)".into());
    }
    if c.spec.jwt_key_ref.is_none() {
        return Some("spec.jwtKeyRef is required (the Secret holding the JWT key)".into());
    }
    None
}

/// Reconcile one Controller.
///
/// # Errors
/// API errors (retried with the Controller's backoff by the error policy).
pub async fn reconcile(c: Arc<Controller>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.instrumented(c.as_ref(), reconcile_inner(&c, &ctx)).await
}

/// What a pass found.
struct Pass<'a> {
    ctx: &'a Context,
    c: &'a Controller,
    conditions: ConditionChanges,
    /// Refused writes and the ownership problem: `(reason, message)`.
    failures: Vec<(&'static str, String)>,
    /// The builder failed or refused the input: `(condition type, message)`.
    problem: Option<(&'static str, String)>,
}

impl Pass<'_> {
    fn current(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
        self.c
            .status
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default()
    }

    async fn problem(&mut self, type_: &'static str, message: String) {
        if !ConditionChanges::already_true(self.current(), type_, &message) {
            self.ctx
                .event(self.c, EventType::Warning, type_, message.clone())
                .await;
        }
        self.problem = Some((type_, message));
    }

    /// A refused write (an Event each time) or an ownership problem (an Event once).
    async fn failed(&mut self, reason: &'static str, message: String, once: bool) {
        if !once || !ConditionChanges::already_true(self.current(), conditions::SERVICE_FAILURE, &message) {
            tracing::warn!(reason, "{message}");
            self.ctx
                .event(self.c, EventType::Warning, reason, message.clone())
                .await;
        }
        self.failures.push((reason, message));
    }
}

async fn reconcile_inner(c: &Controller, ctx: &Context) -> Result<Action, Error> {
    if c.metadata.deletion_timestamp.is_some() || !ctx.serves(&c.namespace().unwrap_or_default()) {
        return Ok(Action::await_change());
    }
    let mut pass = Pass {
        ctx,
        c,
        conditions: ConditionChanges::new(c.metadata.generation),
        failures: Vec::new(),
        problem: None,
    };
    let mut ready_message = String::new();
    if let Some(problem) = spec_problem(c) {
        pass.problem(conditions::INVALID_SPEC, problem).await;
    } else if c.spec.external {
        prune(&mut pass, None).await;
        ready_message = "slurmctld runs outside Kubernetes".into();
    } else {
        let plugin = ctx.plugins.active(BuilderKind::ControllerService);
        let (copy, build) = (c.clone(), ctx.build.clone());
        ctx.metrics
            .plugin_calls
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let metrics = ctx.metrics.clone();
        let call = move || {
            metrics.time_plugin_call(BuilderKind::ControllerService, || {
                plugin.build_service(&build, &copy)
            })
        };
        match ctx.blocking(call).await? {
            Ok(svc) => {
                let name = svc.name_any();
                if ensure_service(&mut pass, svc).await? {
                    ready_message = format!("Service {name} is applied");
                }
                prune(&mut pass, Some(&name)).await;
            }
            Err(e) => {
                ctx.metrics
                    .plugin_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                match &e {
                    PluginError::Build {
                        error: GuestError::InvalidInput(m),
                        ..
                    } => pass.problem(conditions::INVALID_SPEC, m.clone()).await,
                    other => pass.problem(conditions::BUILDER_FAILED, other.to_string()).await,
                }
            }
        }
    }

    let key = object_key(c);
    let retry = !pass.failures.is_empty()
        || pass
            .problem
            .as_ref()
            .is_some_and(|(t, _)| *t == conditions::BUILDER_FAILED);
    write_status(&mut pass, &ready_message).await?;
    let requeue = if retry {
        ctx.backoff.failure(&key)
    } else {
        ctx.backoff.success(&key);
        ctx.resync
    };
    Ok(Action::requeue(requeue))
}

/// The hash of a Service as the builder wants it.
fn applied_hash(svc: &Service) -> String {
    let text = serde_json::to_string(svc).unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// Whether `svc` is controlled by `c`.
fn controlled_by(svc: &Service, c: &Controller) -> bool {
    svc.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == c.uid().as_ref())
}

/// Apply the built Service unless the live one already has it; `true` when the Service is as
/// built afterwards.
async fn ensure_service(pass: &mut Pass<'_>, mut svc: Service) -> Result<bool, Error> {
    let (ctx, c) = (pass.ctx, pass.c);
    let name = svc.name_any();
    let namespace = svc.namespace().unwrap_or_default();
    let hash = applied_hash(&svc);
    svc.annotations_mut()
        .insert(ANNOTATION_APPLIED_HASH.into(), hash.clone());
    let cached = ctx
        .services
        .get(&ObjectRef::new(&name).within(&namespace))
        .map(|s| s.as_ref().clone());
    // Not in the cache: the cache may lag. Read the API before creating anything.
    let live = match cached {
        Some(s) => Some(s),
        None => Api::<Service>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&name)
            .await?
            .map(|mut s| {
                s.metadata.managed_fields = None;
                s
            }),
    };
    let resource_version = match &live {
        Some(s) if !controlled_by(s, c) => {
            let holder = s
                .owner_references()
                .iter()
                .find(|o| o.controller == Some(true))
                .map_or("no controller".to_string(), |o| {
                    format!("controller {} {}", o.kind, o.name)
                });
            let msg = format!(
                "Service {name} exists and is not this Controller's ({holder}): it is left alone; \
                 delete it, or add this Controller as its controller owner, to let the host manage it"
            );
            pass.failed("ServiceNotOwned", msg, true).await;
            return Ok(false);
        }
        Some(s) => {
            let up_to_date = s.annotations().get(ANNOTATION_APPLIED_HASH) == Some(&hash)
                && contains(
                    &serde_json::to_value(s).unwrap_or(Value::Null),
                    &serde_json::to_value(&svc).unwrap_or(Value::Null),
                );
            if up_to_date {
                return Ok(true);
            }
            s.resource_version()
        }
        None => None,
    };
    match ctx.writer.apply_service(&svc, resource_version).await {
        Ok(stored) => {
            let paths = differences(
                &serde_json::to_value(&stored).unwrap_or(Value::Null),
                &serde_json::to_value(&svc).unwrap_or(Value::Null),
                10,
            );
            if !paths.is_empty() {
                let note = dropped_note(&format!("Service {name}"), &paths);
                tracing::warn!("{note}");
                ctx.event(c, EventType::Warning, "FieldsDropped", note).await;
            }
            Ok(true)
        }
        Err(e) => {
            let msg = format!("Error applying Service {name}: {}", writer::message(&e));
            pass.failed("FailedApply", msg, false).await;
            Ok(false)
        }
    }
}

/// Delete the Services this Controller controls that the host built, but for `keep`.
async fn prune(pass: &mut Pass<'_>, keep: Option<&str>) {
    let (ctx, c) = (pass.ctx, pass.c);
    let namespace = c.namespace().unwrap_or_default();
    let stale: Vec<Arc<Service>> = ctx
        .services
        .state()
        .into_iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace.as_str()))
        .filter(|s| Some(s.name_any().as_str()) != keep)
        .filter(|s| controlled_by(s, c) && s.annotations().contains_key(keys::ANNOTATION_BUILDER))
        .collect();
    for s in stale {
        let name = s.name_any();
        match ctx
            .writer
            .delete_service(&namespace, &name, &s.uid().unwrap_or_default())
            .await
        {
            Ok(true) => {
                ctx.event(
                    c,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted Service {name}: the host no longer builds it"),
                )
                .await
            }
            Ok(false) => {}
            Err(e) => {
                let msg = format!("Error deleting Service {name}: {}", writer::message(&e));
                pass.failed("FailedDelete", msg, false).await;
            }
        }
    }
}

async fn write_status(pass: &mut Pass<'_>, ready_message: &str) -> Result<(), Error> {
    let c = pass.c;
    let conds = &mut pass.conditions;
    for t in [conditions::INVALID_SPEC, conditions::BUILDER_FAILED] {
        conds.clear(t);
    }
    if let Some((type_, msg)) = &pass.problem {
        conds.set(type_, true, type_, msg.clone());
        conds.set(conditions::READY, false, type_, msg.clone());
    } else if let Some((reason, msg)) = pass.failures.first() {
        conds.set(conditions::SERVICE_FAILURE, true, reason, msg.clone());
        conds.set(conditions::READY, false, reason, msg.clone());
    } else {
        conds.clear(conditions::SERVICE_FAILURE);
        let reason = if c.spec.external {
            "External"
        } else {
            "ServiceApplied"
        };
        conds.set(conditions::READY, true, reason, ready_message.to_string());
    }
    let api: Api<Controller> = Api::namespaced(pass.ctx.client.clone(), &c.namespace().unwrap_or_default());
    let changes = pass.conditions.clone();
    let generation = c.metadata.generation;
    let compute = move |obj: &Controller| ControllerStatus {
        observed_generation: generation,
        conditions: changes.apply(
            obj.status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default(),
        ),
    };
    pass.ctx
        .writer
        .update_status(&api, c, compute, |obj: &Controller| obj.status.clone())
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_hash_follows_the_built_service() {
        let mut a = Service::default();
        a.metadata.name = Some("slurm-controller".into());
        let h = applied_hash(&a);
        assert_eq!(h, applied_hash(&a.clone()));
        a.metadata.labels = Some([("x".to_string(), "y".to_string())].into());
        assert_ne!(applied_hash(&a), h);
    }
}
