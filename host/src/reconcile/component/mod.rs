//! What the reconcilers of the component parents share (a RestApi's slurmrestd, a LoginSet's
//! login nodes, an Accounting's slurmdbd): one pass that applies what the builder returned,
//! prunes what it no longer returns, and sets the host's conditions from what the pass found.
//!
//! # Guarantees
//! * A child is applied only over an object its parent controls, or created
//!   ([`ChildSync::ensure`]); a steady state makes no writes.
//! * Children the builder no longer returns are deleted with a UID precondition, but only after
//!   a pass in which the builder answered, and never those of the `kept` kinds (state).
//! * The conditions say what stopped the pass (`InvalidSpec`, `BuilderFailed`, a missing
//!   reference), what was refused (`ChildFailure`), or that every child is applied (`Ready`).

use kube::{Api, Resource};

use super::{
    Error,
    core::apply::{ChildSync, keys_of},
    core::pass::{PassState, first_of},
    core::status::ConditionChanges,
};
use crate::plugins::{Child, ChildKind};
use slinky_api::conditions;

/// Apply `desired` (in kind and name order), then prune the other children of `kinds` the parent
/// controls (never those of `kept`); the descriptions of the children that are as built.
///
/// # Errors
/// API errors reading a live child (a refused write is a failure of `sync`, not an error).
pub(super) async fn apply_and_prune<P: Resource<DynamicType = ()>>(
    sync: &mut ChildSync<'_, P>,
    mut desired: Vec<Child>,
    kinds: &[ChildKind],
    kept: &[ChildKind],
) -> Result<Vec<String>, Error> {
    desired.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
    let mut applied = Vec::new();
    for child in &desired {
        if sync.ensure(child).await? {
            applied.push(child.describe());
        }
    }
    sync.prune(kinds, &keys_of(&desired), kept).await;
    Ok(applied)
}

/// The host's conditions after a component pass: the problem that stopped it (clearing the
/// others of `problem_types`), the refused writes (`ChildFailure`), `Ready` with what was
/// applied and `readiness` (e.g. "slurmrestd 1/1 ready").
pub(super) fn set_conditions<P: Resource<DynamicType = ()>>(
    state: &mut PassState<'_, P>,
    problem_types: &[&'static str],
    failures: &[(&'static str, String)],
    applied: &[String],
    readiness: Option<String>,
) {
    let conds: &mut ConditionChanges = &mut state.conditions;
    for t in problem_types {
        conds.clear(t);
    }
    if let Some((reason, message)) = first_of(failures, "") {
        conds.set(conditions::CHILD_FAILURE, true, reason, message);
    } else if state.problem.is_none() {
        conds.clear(conditions::CHILD_FAILURE);
    }
    if let Some((type_, msg)) = &state.problem {
        conds.set(type_, true, type_, msg.clone());
        conds.set(conditions::READY, false, type_, msg.clone());
    } else if let Some((reason, msg)) = failures.first() {
        conds.set(conditions::READY, false, reason, msg.clone());
    } else {
        let mut message = if applied.is_empty() {
            "nothing to build".to_string()
        } else {
            format!("applied {}", applied.join(", "))
        };
        if let Some(r) = readiness {
            message.push_str(&format!("; {r}"));
        }
        conds.set(conditions::READY, true, "ChildrenApplied", message);
    }
}

/// Write `status` (computed by `compute` from the object as read, the host's condition changes
/// merged into its conditions) when it changed.
///
/// # Errors
/// API errors (a 409 is retried from a fresh read by the writer).
pub(super) async fn write_status<P, S>(
    core: &super::Core,
    parent: &P,
    compute: impl Fn(&P) -> S + Send + Sync,
    current: impl Fn(&P) -> Option<S> + Send + Sync,
) -> Result<(), Error>
where
    P: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    S: serde::Serialize + PartialEq + Send + Sync,
{
    let api: Api<P> = Api::namespaced(
        core.client.clone(),
        parent.meta().namespace.as_deref().unwrap_or_default(),
    );
    core.writer.update_status(&api, parent, compute, current).await?;
    Ok(())
}
