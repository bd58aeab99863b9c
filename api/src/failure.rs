//! Why a pass stopped, or what it could not do, typed: the condition it sets on the parent, the
//! reason its condition and its Event carry, the message, the metric label and how the pass is
//! retried. One type for every kind's reconciler instead of `(reason, message)` pairs.

use crate::conditions;

/// How a parent whose pass met a failure comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// When the parent (or what it references) changes: retrying the same inputs gives the
    /// same answer (an invalid spec; a missing Controller, whose watch triggers the parent).
    OnChange,
    /// With the parent's exponential backoff: a write refused, a builder failed, a reference
    /// missing.
    Backoff,
    /// Within seconds, whatever the backoff has grown to: Slurm could not be asked.
    Soon,
}

/// A failure of a pass, as its parent's status and Events show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The condition it sets on the parent ([`conditions`]).
    pub condition: &'static str,
    /// The condition's and the Event's reason (`SecretNotFound`, `FailedApply`,
    /// `SlurmUnreachable`, …; the condition type when there is no finer one).
    pub reason: &'static str,
    /// What happened and how to fix it.
    pub message: String,
}

impl Failure {
    /// A failure setting `condition` with `reason`.
    pub fn new(condition: &'static str, reason: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            condition,
            reason,
            message: message.into(),
        }
    }

    /// The spec is invalid (`InvalidSpec`).
    pub fn invalid_spec(message: impl Into<String>) -> Failure {
        Failure::new(conditions::INVALID_SPEC, conditions::INVALID_SPEC, message)
    }

    /// The builder failed other than by refusing its input (`BuilderFailed`).
    pub fn builder_failed(message: impl Into<String>) -> Failure {
        Failure::new(conditions::BUILDER_FAILED, conditions::BUILDER_FAILED, message)
    }

    /// The parent's Controller does not exist (`ControllerNotFound`).
    pub fn controller_not_found(message: impl Into<String>) -> Failure {
        Failure::new(
            conditions::CONTROLLER_NOT_FOUND,
            conditions::CONTROLLER_NOT_FOUND,
            message,
        )
    }

    /// A referenced Secret, ConfigMap or Accounting is missing (`ReferenceNotFound`, with
    /// `reason` such as `SecretNotFound`).
    pub fn reference_not_found(reason: &'static str, message: impl Into<String>) -> Failure {
        Failure::new(conditions::REFERENCE_NOT_FOUND, reason, message)
    }

    /// A child write was refused or a child is not the parent's (`ChildFailure`).
    pub fn child(reason: &'static str, message: impl Into<String>) -> Failure {
        Failure::new(conditions::CHILD_FAILURE, reason, message)
    }

    /// A NodeSet's pod write was refused (`ReplicaFailure`).
    pub fn replica(reason: &'static str, message: impl Into<String>) -> Failure {
        Failure::new(conditions::REPLICA_FAILURE, reason, message)
    }

    /// Slurm could not be asked or refused (`SlurmFailure`).
    pub fn slurm(reason: &'static str, message: impl Into<String>) -> Failure {
        Failure::new(conditions::SLURM_FAILURE, reason, message)
    }

    /// The label of this failure in metrics: its reason.
    pub fn metric_label(&self) -> &'static str {
        self.reason
    }

    /// How the pass that met it comes back.
    pub fn retry(&self) -> Retry {
        match (self.condition, self.reason) {
            (conditions::INVALID_SPEC | conditions::CONTROLLER_NOT_FOUND, _) => Retry::OnChange,
            (conditions::SLURM_FAILURE, _) => Retry::Soon,
            // A BuilderPlugin refused for what its spec says, or for what its module is: the same
            // inputs give the same answer. A registry, a signature pushed later, a ConfigMap being
            // written: tried again.
            // `Unverified`: the host's own settings, which change only with a restart.
            (conditions::LOADED, "InvalidSpec" | "InvalidSettings" | "Refused" | "Unverified") => {
                Retry::OnChange
            }
            _ => Retry::Backoff,
        }
    }

    /// Whether `current` (a parent's conditions) already shows this failure: its condition
    /// True with this message. Its Event was sent when it was set, and is not sent again.
    pub fn shown_in(&self, current: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition]) -> bool {
        current
            .iter()
            .any(|c| c.type_ == self.condition && c.status == "True" && c.message == self.message)
    }

    /// The first of `failures`, its message counting the others as `(and N more{what})`.
    pub fn first_of(failures: &[Failure], what: &str) -> Option<Failure> {
        let first = failures.first()?;
        let message = match failures.len() {
            1 => first.message.clone(),
            n => format!("{} (and {} more{what})", first.message, n - 1),
        };
        Some(Failure {
            message,
            ..first.clone()
        })
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.condition, self.reason, self.message)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    use super::*;

    #[test]
    fn a_failure_knows_its_condition_retry_and_whether_it_is_shown() {
        let missing = Failure::reference_not_found("SecretNotFound", "Secret slurm/x does not exist");
        assert_eq!(missing.condition, conditions::REFERENCE_NOT_FOUND);
        assert_eq!(missing.metric_label(), "SecretNotFound");
        assert_eq!(missing.retry(), Retry::Backoff);
        assert_eq!(Failure::invalid_spec("x").retry(), Retry::OnChange);
        assert_eq!(Failure::slurm("SlurmUnreachable", "x").retry(), Retry::Soon);
        let shown = Condition {
            type_: conditions::REFERENCE_NOT_FOUND.into(),
            status: "True".into(),
            reason: "SecretNotFound".into(),
            message: missing.message.clone(),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        };
        assert!(missing.shown_in(std::slice::from_ref(&shown)));
        assert!(!Failure::reference_not_found("SecretNotFound", "other").shown_in(&[shown]));
    }

    #[test]
    fn the_first_failure_counts_the_others() {
        let f = |m: &str| Failure::child("FailedApply", m);
        assert_eq!(Failure::first_of(&[], ""), None);
        assert_eq!(
            Failure::first_of(&[f("a")], "").map(|f| f.message),
            Some("a".to_string())
        );
        assert_eq!(
            Failure::first_of(&[f("a"), f("b"), f("c")], " writes").map(|f| f.message),
            Some("a (and 2 more writes)".to_string())
        );
    }
}
