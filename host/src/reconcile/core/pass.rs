//! What one pass of either reconciler found, for the status it writes at the end: the condition
//! changes, the problem that stopped the pass (with an Event the first time its message is seen),
//! and whether a builder failed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Resource, runtime::events::EventType};
use slinky_api::conditions;

use super::{context::Core, status::ConditionChanges};
use crate::plugins::{GuestError, PluginError};

/// The state of one pass over `parent` that both reconcilers keep alike.
pub(crate) struct PassState<'a, P: Resource<DynamicType = ()>> {
    core: &'a Core,
    parent: &'a P,
    /// The parent's conditions when the pass began.
    current: &'a [Condition],
    /// The host's decisions about its condition types.
    pub conditions: ConditionChanges,
    /// A condition that stops the pass: `(type, message)`.
    pub problem: Option<(&'static str, String)>,
    /// A builder failed other than by refusing its input (back off like a failed write).
    pub builder_failed: bool,
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
            builder_failed: false,
        }
    }

    /// The parent's conditions when the pass began.
    pub(crate) fn current(&self) -> &'a [Condition] {
        self.current
    }

    /// A condition that stops the pass; an Event the first time its message is seen.
    pub(crate) async fn problem(&mut self, type_: &'static str, message: String) {
        if !ConditionChanges::already_true(self.current, type_, &message) {
            self.core
                .event(self.parent, EventType::Warning, type_, message.clone())
                .await;
        }
        self.problem = Some((type_, message));
    }

    /// A builder error: `InvalidSpec` when the builder says the input is invalid, else
    /// `BuilderFailed`.
    pub(crate) async fn builder_error(&mut self, e: &PluginError) {
        self.core.metrics.plugin_failures.inc();
        match e {
            PluginError::Build {
                error: GuestError::InvalidInput(m),
                ..
            } => self.problem(conditions::INVALID_SPEC, m.clone()).await,
            other => {
                self.builder_failed = true;
                self.problem(conditions::BUILDER_FAILED, other.to_string()).await;
            }
        }
    }
}

/// The first of `failures` as `(reason, message)`, the message counting the others as
/// `(and N more{what})`.
pub(crate) fn first_of(failures: &[(&'static str, String)], what: &str) -> Option<(&'static str, String)> {
    let (reason, first) = failures.first()?;
    let message = match failures.len() {
        1 => first.clone(),
        n => format!("{first} (and {} more{what})", n - 1),
    };
    Some((reason, message))
}
