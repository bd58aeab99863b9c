//! The RestApi reconciler: slurmrestd's Deployment and Service (`restapi-children` builder),
//! applied through the one child path ([`super::core::apply`]); status conditions and
//! `observedGeneration`. The Controller's slurmrestd client talks to the oldest RestApi's
//! Service ([`super::slurm`]).
//!
//! # Guarantees
//! * The builder gets copies of the RestApi and its Controller, never a Secret (the pods mount
//!   the Controller's key by reference).
//! * A missing Controller is a `ControllerNotFound` condition and an Event; the existing children
//!   stay (slurmrestd keeps serving what it served) until the Controller is back.
//! * Every child is applied only over an object this RestApi controls, or created; a steady state
//!   makes no writes; children the builder no longer returns are deleted with a UID
//!   precondition, but only after a pass in which the builder answered.
//! * A refused write is an Event (`FailedApply`, `FailedDelete`) and a `ChildFailure` condition,
//!   retried with the RestApi's exponential backoff.

use crate::plugins::Builder as _;
use std::{collections::BTreeSet, sync::Arc};

use kube::{
    ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use slinky_api::{Controller, RestApi, RestApiStatus, checks, conditions};

use super::{
    ControllerContext, Error, component, core::apply::ChildSync, core::backoff, core::pass::PassState,
};
use crate::plugins::{BuilderKind, ChildKind};

/// The kinds of a RestApi's children (what pruning looks at).
const CHILD_KINDS: [ChildKind; 2] = [ChildKind::Deployment, ChildKind::Service];

/// Reconcile one RestApi.
///
/// # Errors
/// API errors (retried with the RestApi's backoff by the error policy).
pub async fn reconcile(r: Arc<RestApi>, ctx: Arc<ControllerContext>) -> Result<Action, Error> {
    ctx.core.instrumented(r.as_ref(), reconcile_inner(&r, &ctx)).await
}

async fn reconcile_inner(r: &RestApi, ctx: &ControllerContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    let ns = r.namespace().unwrap_or_default();
    if r.metadata.deletion_timestamp.is_some() || !core.serves(&ns) {
        return Ok(Action::await_change());
    }
    let current = r
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let mut state = PassState::new(core, r, current);
    let mut sync = ChildSync::new(
        core,
        &ctx.caches.children,
        &ctx.applied,
        r,
        current,
        BTreeSet::new(),
    );
    let mut applied = Vec::new();
    let controller = ctx
        .caches
        .controllers
        .get(&ObjectRef::<Controller>::new(&r.spec.controller_ref.name).within(&ns));
    if let Some(problem) = checks::summary(&r.spec_problems()) {
        state.problem(conditions::INVALID_SPEC, problem).await;
    } else if let Some(controller) = controller {
        let (copy, ctl) = (r.clone(), controller.as_ref().clone());
        let built = core
            .call_builder(BuilderKind::RestapiChildren, r.labels(), move |plugin, build| {
                plugin.build_restapi_children(build, &copy, &ctl)
            })
            .await?;
        match built {
            Ok(desired) => {
                applied = component::apply_and_prune(&mut sync, desired, &CHILD_KINDS, &[]).await?;
            }
            Err(e) => state.builder_error(&e).await,
        }
    } else {
        let message = format!(
            "Controller {ns}/{} (spec.controllerRef) does not exist: slurmrestd's Deployment and \
             Service wait for it (the existing ones are kept)",
            r.spec.controller_ref.name
        );
        state.problem(conditions::CONTROLLER_NOT_FOUND, message).await;
    }
    let failures = sync.finish();
    let retry = !failures.is_empty() || state.builder_failed;
    component::set_conditions(
        &mut state,
        &[
            conditions::INVALID_SPEC,
            conditions::BUILDER_FAILED,
            conditions::CONTROLLER_NOT_FOUND,
        ],
        &failures,
        &applied,
        readiness(ctx, r),
    );
    let changes = state.conditions.clone();
    let generation = r.metadata.generation;
    component::write_status(
        core,
        r,
        move |obj: &RestApi| RestApiStatus {
            observed_generation: generation,
            conditions: changes.apply(
                obj.status
                    .as_ref()
                    .map(|s| s.conditions.as_slice())
                    .unwrap_or_default(),
            ),
        },
        |obj: &RestApi| obj.status.clone(),
    )
    .await?;
    let requeue = core
        .backoff
        .record(&backoff::key(r), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync);
    Ok(Action::requeue(requeue))
}

/// slurmrestd's readiness, as its Deployment reports it.
fn readiness(ctx: &ControllerContext, r: &RestApi) -> Option<String> {
    let key = ObjectRef::new(&r.restapi_key()).within(&r.namespace().unwrap_or_default());
    let d = ctx.caches.children.deployments.get(&key)?;
    let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
    Some(format!("slurmrestd {ready}/{} ready", r.replicas()))
}
