//! One pass for the component parents (a RestApi's slurmrestd, a LoginSet's login nodes, an
//! Accounting's slurmdbd): read what the builder needs, build, apply what the builder returned,
//! prune what it no longer returns, and write the host's conditions. What differs between them is
//! the [`Component`] trait: their builder and child kinds, their inputs, what the host does to
//! their children before applying, their readiness and their status.
//!
//! # Guarantees
//! * The builder gets copies of the parent (and of its Controller where it needs one) and hashes
//!   of the Secrets it needs, never a Secret's data.
//! * A child is applied only over an object its parent controls, or created
//!   ([`ChildSync::ensure`]); a steady state makes no writes.
//! * Children the builder no longer returns are deleted with a UID precondition, but only after
//!   a pass in which the builder answered, and never those of the `kept` kinds (state).
//! * The conditions say what stopped the pass (`InvalidSpec`, `BuilderFailed`,
//!   `ControllerNotFound`, `ReferenceNotFound`, each with an Event when it is new), what was
//!   refused (`ChildFailure`), or that every child is applied (`Ready`). A missing Controller or
//!   reference keeps the existing children (the daemons keep serving what they served).
//! * A refused write is an Event and a `ChildFailure` condition, retried with the parent's
//!   exponential backoff, as are a builder failure and a missing reference.

use std::{collections::BTreeSet, future::Future, sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{
    ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};
use slinky_api::{Controller, conditions, failure::Failure};

use super::core::{
    Error,
    applied::AppliedVersions,
    apply::{ChildSync, keys_of},
    backoff,
    caches::Caches,
    context::Core,
    pass::PassState,
    status::{self, ConditionChanges, HasStatus},
};
use crate::plugins::{BuildContext, BuilderKind, Child, ChildKind, Pipeline, PluginError};

/// What a component pass receives.
pub struct ComponentContext {
    /// What every reconciler shares.
    pub core: Arc<Core>,
    /// The caches (the parent's Controller and children).
    pub caches: Caches,
    /// What the host last applied to each child (hash and resulting resourceVersion).
    pub applied: Arc<AppliedVersions>,
}

/// What the host does with a component's built children before applying them.
pub(crate) struct Prepared {
    /// The children to apply.
    pub children: Vec<Child>,
    /// Come back within a second (a new configuration was written: roll the daemon with it).
    pub come_back_soon: bool,
}

/// A parent whose children one builder makes and the generic pass applies.
pub(crate) trait Component: HasStatus {
    /// The builder of its children.
    const BUILDER: BuilderKind;
    /// The kinds of its built children that pruning looks at.
    const CHILD_KINDS: &'static [ChildKind];
    /// What its builder needs besides the parent, read by [`Component::inputs`].
    type Inputs: Send + Sync + 'static;

    /// What is wrong with its spec (`InvalidSpec`), if anything.
    fn spec_problem(&self) -> Option<String>;

    /// What the builder needs; or the failure the pass waits on (`None`: a failure `sync`
    /// already has, such as a host-made Secret that is not the parent's).
    fn inputs(
        &self,
        ctx: &ComponentContext,
        sync: &mut ChildSync<'_, Self>,
    ) -> impl Future<Output = Result<Result<Self::Inputs, Option<Failure>>, Error>> + Send;

    /// Build its children (off the async threads, on a copy).
    ///
    /// # Errors
    /// The builder's.
    fn build(
        &self,
        builder: &Pipeline,
        ctx: &BuildContext,
        inputs: &Self::Inputs,
    ) -> Result<Vec<Child>, PluginError>;

    /// What the host does to the built children before they are applied (default: nothing).
    ///
    /// # Errors
    /// An `InvalidSpec` failure: the children cannot be made from this spec.
    fn prepare(&self, children: Vec<Child>, _inputs: &Self::Inputs) -> Result<Prepared, Failure> {
        Ok(Prepared {
            children,
            come_back_soon: false,
        })
    }

    /// What the host made itself for it this pass, for the `Ready` message (a LoginSet's host keys).
    fn made_by_host(&self) -> Option<String> {
        None
    }

    /// The kinds of its children that are never pruned for being left out of a build (state).
    fn kept(&self) -> &'static [ChildKind] {
        &[]
    }

    /// Its daemon's readiness (`slurmrestd 1/1 ready`), from the caches.
    fn readiness(&self, caches: &Caches) -> Option<String>;

    /// Its status after a pass: `observed` is the object as read (the cached one, or after a
    /// 409 a fresh one), `conditions` its conditions with the pass' changes merged in.
    fn status_after(&self, observed: &Self, conditions: Vec<Condition>, caches: &Caches) -> Self::Status;
}

/// The Controller a component references (`spec.controllerRef`), or `ControllerNotFound`.
pub(crate) fn controller_of(
    caches: &Caches,
    ns: &str,
    name: &str,
    what_waits: &str,
) -> Result<Arc<Controller>, Failure> {
    caches
        .controllers
        .get(&ObjectRef::<Controller>::new(name).within(ns))
        .ok_or_else(|| {
            Failure::controller_not_found(format!(
                "Controller {ns}/{name} (spec.controllerRef) does not exist: {what_waits} wait for it \
                 (the existing ones are kept)"
            ))
        })
}

/// How soon a pass that wrote a new configuration comes back to roll the daemon with it.
const COME_BACK_SOON: Duration = Duration::from_secs(1);

/// Reconcile one component parent.
///
/// # Errors
/// API errors (retried with the parent's backoff by the error policy).
pub(crate) async fn reconcile<C: Component + 'static>(
    parent: Arc<C>,
    ctx: Arc<ComponentContext>,
) -> Result<Action, Error> {
    ctx.core
        .instrumented(parent.as_ref(), pass(parent.as_ref(), &ctx))
        .await
}

/// What a pass applied, and whether it comes back soon.
#[derive(Default)]
struct Outcome {
    applied: Vec<String>,
    come_back_soon: bool,
}

async fn pass<C: Component + 'static>(p: &C, ctx: &ComponentContext) -> Result<Action, Error> {
    let core = ctx.core.as_ref();
    if p.meta().deletion_timestamp.is_some() || !core.serves(&p.namespace().unwrap_or_default()) {
        return Ok(Action::await_change());
    }
    let current = p.conditions();
    let mut state = PassState::new(core, p, current);
    let mut sync = ChildSync::new(
        core,
        &ctx.caches.children,
        &ctx.applied,
        p,
        current,
        BTreeSet::new(),
    );
    let outcome = build_and_apply(p, ctx, &mut state, &mut sync).await?;
    let failures = sync.finish();
    set_conditions(
        &mut state.conditions,
        state.problem.as_ref(),
        &failures,
        &outcome.applied,
        || p.readiness(&ctx.caches),
    );
    let caches = ctx.caches.clone();
    status::write(core, p, &state.conditions, move |obj, conditions| {
        p.status_after(obj, conditions, &caches)
    })
    .await?;
    let retry = !failures.is_empty() || state.retry_problem();
    let requeue = core
        .backoff
        .record(&backoff::key(p), backoff::Outcome::of(true, retry))
        .unwrap_or(core.resync);
    Ok(Action::requeue(
        if outcome.come_back_soon && failures.is_empty() {
            requeue.min(COME_BACK_SOON)
        } else {
            requeue
        },
    ))
}

/// Read the inputs, build, prepare and apply: what stopped the pass goes into `state`.
async fn build_and_apply<C: Component + 'static>(
    p: &C,
    ctx: &ComponentContext,
    state: &mut PassState<'_, C>,
    sync: &mut ChildSync<'_, C>,
) -> Result<Outcome, Error> {
    if let Some(problem) = p.spec_problem() {
        state.problem(Failure::invalid_spec(problem)).await;
        return Ok(Outcome::default());
    }
    let inputs = match p.inputs(ctx, sync).await? {
        Ok(inputs) => Arc::new(inputs),
        Err(waits) => {
            if let Some(failure) = waits {
                state.problem(failure).await;
            }
            return Ok(Outcome::default());
        }
    };
    let (copy, read) = (p.clone(), inputs.clone());
    let built = ctx
        .core
        .call_builder(C::BUILDER, p.meta(), move |builder, build| {
            copy.build(builder, build, &read)
        })
        .await?;
    let prepared = match built {
        Ok(children) => p.prepare(children, &inputs),
        Err(e) => {
            state.builder_error(&e).await;
            return Ok(Outcome::default());
        }
    };
    let Prepared {
        mut children,
        come_back_soon,
    } = match prepared {
        Ok(prepared) => prepared,
        Err(failure) => {
            state.problem(failure).await;
            return Ok(Outcome::default());
        }
    };
    let mut applied: Vec<String> = p.made_by_host().into_iter().collect();
    children.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
    for child in &children {
        if sync.ensure(child).await? {
            applied.push(child.describe());
        }
    }
    sync.prune(C::CHILD_KINDS, &keys_of(&children), p.kept()).await;
    Ok(Outcome {
        applied,
        come_back_soon,
    })
}

/// The condition types a component pass stops at (cleared by a pass that does not).
const PROBLEMS: [&str; 4] = [
    conditions::INVALID_SPEC,
    conditions::BUILDER_FAILED,
    conditions::CONTROLLER_NOT_FOUND,
    conditions::REFERENCE_NOT_FOUND,
];

/// The host's conditions after a component pass: the problem that stopped it (clearing the
/// others), the refused writes (`ChildFailure`), `Ready` with what was applied and the
/// daemon's readiness.
fn set_conditions(
    conds: &mut ConditionChanges,
    problem: Option<&Failure>,
    failures: &[Failure],
    applied: &[String],
    readiness: impl FnOnce() -> Option<String>,
) {
    for t in PROBLEMS {
        conds.clear(t);
    }
    if let Some(f) = Failure::first_of(failures, "") {
        conds.set_failure(&f);
    } else if problem.is_none() {
        conds.clear(conditions::CHILD_FAILURE);
    }
    if let Some(f) = problem.or(failures.first()) {
        if problem.is_some() {
            conds.set_problem(f);
        } else {
            conds.set(conditions::READY, false, f.reason, f.message.clone());
        }
        return;
    }
    let mut message = if applied.is_empty() {
        "nothing to build".to_string()
    } else {
        format!("applied {}", applied.join(", "))
    };
    if let Some(r) = readiness() {
        message.push_str(&format!("; {r}"));
    }
    conds.set(conditions::READY, true, "ChildrenApplied", message);
}
