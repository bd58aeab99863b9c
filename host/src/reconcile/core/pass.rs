//! What one pass of any reconciler found, for the status it writes at the end: the condition
//! changes, the failure that stopped the pass, and whether a builder failed; and the one rule for
//! a failure's Event: sent when the failure is new, not again while the parent's status shows it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, runtime::events::EventType};
use slinky_api::failure::{Failure, Retry};

use super::{context::Core, status::ConditionChanges};
use crate::plugins::{GuestError, PluginError};

/// The state of one pass over `parent` that every reconciler keeps alike.
pub(crate) struct PassState<'a, P: Resource<DynamicType = ()>> {
    core: &'a Core,
    parent: &'a P,
    /// The parent's conditions when the pass began.
    current: &'a [Condition],
    /// The host's decisions about its condition types.
    pub conditions: ConditionChanges,
    /// The failure that stopped the pass (an invalid spec, a missing Controller or reference, a
    /// builder failure).
    pub problem: Option<Failure>,
}

impl<'a, P: Resource<DynamicType = ()>> PassState<'a, P> {
    /// A pass over `parent`, whose conditions are `current`.
    pub(crate) fn new(core: &'a Core, parent: &'a P, current: &'a [Condition]) -> Self {
        PassState {
            core,
            parent,
            current,
            conditions: ConditionChanges::new(parent.meta().generation),
            problem: None,
        }
    }

    /// The parent's conditions when the pass began.
    pub(crate) fn current(&self) -> &'a [Condition] {
        self.current
    }

    /// A failure that stops the pass: a Warning Event unless the status shows it already.
    pub(crate) async fn problem(&mut self, failure: Failure) {
        self.core.report(self.parent, self.current, &failure).await;
        self.problem = Some(failure);
    }

    /// A builder error: `InvalidSpec` when the builder says the input is invalid, else
    /// `BuilderFailed`.
    pub(crate) async fn builder_error(&mut self, e: &PluginError) {
        self.core.metrics.plugin_failures.inc();
        match e {
            PluginError::Build {
                error: GuestError::InvalidInput(m),
                ..
            } => self.problem(Failure::invalid_spec(m.clone())).await,
            other => self.problem(Failure::builder_failed(other.to_string())).await,
        }
    }

    /// Whether the failure that stopped the pass is retried with the backoff (a builder failed,
    /// a reference is missing), not only when the parent changes.
    pub(crate) fn retry_problem(&self) -> bool {
        self.problem
            .as_ref()
            .is_some_and(|f| f.retry() != Retry::OnChange)
    }
}

impl Core {
    /// A failure of a pass over `parent`: a Warning Event (and a log line) unless `current`, the
    /// parent's conditions when the pass began, shows it already (its Event was sent then).
    pub(crate) async fn report<K: Resource<DynamicType = ()>>(
        &self,
        parent: &K,
        current: &[Condition],
        failure: &Failure,
    ) {
        self.report_about(parent, None, current, failure).await;
    }

    /// [`Core::report`] of a failure about `related` (a child the Event names).
    pub(crate) async fn report_about<K: Resource<DynamicType = ()>>(
        &self,
        parent: &K,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
        current: &[Condition],
        failure: &Failure,
    ) {
        if failure.shown_in(current) {
            tracing::debug!(reason = failure.reason, "{}", failure.message);
            return;
        }
        tracing::warn!(reason = failure.reason, "{}", failure.message);
        self.event_about(
            parent,
            related,
            EventType::Warning,
            failure.reason,
            failure.message.clone(),
        )
        .await;
    }
}
