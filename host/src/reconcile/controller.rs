//! The Controller reconciler: the slurmctld Service from the `controller-service` builder,
//! server-side applied; status conditions and `observedGeneration`.

use std::{sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use serde_json::Value;
use slinky_api::{Controller, ControllerStatus};

use super::{Context, Error};
use crate::plugins::BuilderKind;

/// Set a condition, keeping its transition time when its status did not change.
pub(crate) fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) {
    let status_s = if status { "True" } else { "False" };
    let old = conditions.iter().find(|c| c.type_ == type_);
    let time = match old {
        Some(c) if c.status == status_s => c.last_transition_time.clone(),
        _ => Time(
            k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)
                .unwrap_or_default(),
        ),
    };
    conditions.retain(|c| c.type_ != type_);
    conditions.push(Condition {
        type_: type_.into(),
        status: status_s.into(),
        reason: reason.into(),
        message,
        last_transition_time: time,
        observed_generation: generation,
    });
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
}

/// Remove a condition.
pub(crate) fn clear_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// Whether `actual` contains everything in `desired` (maps by key, lists element-wise).
pub(crate) fn contains(actual: &Value, desired: &Value) -> bool {
    match (actual, desired) {
        (Value::Object(a), Value::Object(d)) => d
            .iter()
            .all(|(k, dv)| a.get(k).is_some_and(|av| contains(av, dv))),
        (Value::Array(a), Value::Array(d)) => {
            a.len() == d.len() && a.iter().zip(d).all(|(av, dv)| contains(av, dv))
        }
        (a, d) => a == d,
    }
}

fn spec_problem(c: &Controller) -> Option<String> {
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
/// API errors (retried with backoff by the error policy).
pub async fn reconcile(c: Arc<Controller>, ctx: Arc<Context>, resync: Duration) -> Result<Action, Error> {
    if !ctx.leader.may_write() {
        // A follower: caches only. Becoming the leader re-reconciles everything.
        return Ok(Action::await_change());
    }
    let started = std::time::Instant::now();
    // Every log line of this reconcile carries the object's kind and key.
    let span = tracing::info_span!(
        "reconcile",
        kind = "Controller",
        key = %format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())
    );
    let r = tracing::Instrument::instrument(reconcile_inner(&c, &ctx, resync), span).await;
    let label = match &r {
        Ok(_) => "ok",
        Err(e) => e.metric_label(),
    };
    ctx.metrics
        .record("Controller", label, started.elapsed().as_secs_f64());
    r
}

#[tracing::instrument(skip_all, fields(controller = %format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any())))]
async fn reconcile_inner(c: &Controller, ctx: &Context, resync: Duration) -> Result<Action, Error> {
    if c.metadata.deletion_timestamp.is_some() || !ctx.serves(&c.namespace().unwrap_or_default()) {
        return Ok(Action::await_change());
    }
    let generation = c.metadata.generation;
    let mut conditions = c
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut requeue = resync;
    if let Some(problem) = spec_problem(c) {
        if !conditions
            .iter()
            .any(|x| x.type_ == "InvalidSpec" && x.status == "True" && x.message == problem)
        {
            ctx.event(c, EventType::Warning, "InvalidSpec", problem.clone())
                .await;
        }
        set_condition(
            &mut conditions,
            "InvalidSpec",
            true,
            "InvalidSpec",
            problem,
            generation,
        );
        set_condition(
            &mut conditions,
            "Ready",
            false,
            "InvalidSpec",
            "the spec is invalid".into(),
            generation,
        );
        requeue = Duration::from_secs(60);
    } else if c.spec.external {
        clear_condition(&mut conditions, "InvalidSpec");
        clear_condition(&mut conditions, "BuilderFailed");
        set_condition(
            &mut conditions,
            "Ready",
            true,
            "External",
            "slurmctld runs outside Kubernetes".into(),
            generation,
        );
    } else {
        clear_condition(&mut conditions, "InvalidSpec");
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
                clear_condition(&mut conditions, "BuilderFailed");
                let key = ObjectRef::new(&svc.name_any()).within(&svc.namespace().unwrap_or_default());
                let cached = ctx.services.get(&key);
                let desired = serde_json::to_value(&svc).unwrap_or(Value::Null);
                let up_to_date = cached.is_some_and(|s| {
                    contains(&serde_json::to_value(s.as_ref()).unwrap_or(Value::Null), &desired)
                });
                if !up_to_date {
                    ctx.writer.apply_service(&svc).await?;
                }
                set_condition(
                    &mut conditions,
                    "Ready",
                    true,
                    "ServiceApplied",
                    format!("Service {} is applied", svc.name_any()),
                    generation,
                );
            }
            Err(e) => {
                ctx.metrics
                    .plugin_failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let msg = e.to_string();
                if !conditions
                    .iter()
                    .any(|x| x.type_ == "BuilderFailed" && x.message == msg)
                {
                    ctx.event(c, EventType::Warning, "BuilderFailed", msg.clone())
                        .await;
                }
                set_condition(
                    &mut conditions,
                    "BuilderFailed",
                    true,
                    "BuilderFailed",
                    msg,
                    generation,
                );
                set_condition(
                    &mut conditions,
                    "Ready",
                    false,
                    "BuilderFailed",
                    "the Service builder failed".into(),
                    generation,
                );
                requeue = Duration::from_secs(30);
            }
        }
    }
    let api: Api<Controller> = Api::namespaced(ctx.client.clone(), &c.namespace().unwrap_or_default());
    let status = ControllerStatus {
        observed_generation: generation,
        conditions,
    };
    ctx.writer
        .update_status(
            &api,
            c,
            |_: &Controller| status.clone(),
            |obj: &Controller| obj.status.clone(),
        )
        .await?;
    Ok(Action::requeue(requeue))
}

/// Back off on errors.
pub fn error_policy(_c: Arc<Controller>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(%error, "Controller reconcile failed; retrying");
    Action::requeue(Duration::from_secs(5))
}
