//! Conditions the host owns on its parents' status, as changes merged into what the API server
//! has: a status write retried after a 409 starts again from the fresh object, so conditions set
//! by other writers are kept and the host's own are set, kept or cleared on top.

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{Timestamp, Unit},
};

/// What a reconcile decided about one condition type.
#[derive(Debug, Clone, PartialEq)]
enum Change {
    Set {
        status: bool,
        reason: String,
        message: String,
    },
    Clear,
}

/// The host's decisions about its condition types; types not mentioned are left as they are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConditionChanges {
    changes: Vec<(String, Change)>,
    generation: Option<i64>,
}

impl ConditionChanges {
    /// Changes computed from the object of `generation`.
    pub fn new(generation: Option<i64>) -> Self {
        ConditionChanges {
            changes: Vec::new(),
            generation,
        }
    }

    fn put(&mut self, type_: &str, change: Change) {
        self.changes.retain(|(t, _)| t != type_);
        self.changes.push((type_.to_string(), change));
    }

    /// Set condition `type_`.
    pub fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) {
        self.put(
            type_,
            Change::Set {
                status,
                reason: reason.into(),
                message: message.into(),
            },
        );
    }

    /// Remove condition `type_`.
    pub fn clear(&mut self, type_: &str) {
        self.put(type_, Change::Clear);
    }

    /// Whether `conditions` already has `type_` True with this message (an Event for it was sent).
    pub fn already_true(conditions: &[Condition], type_: &str, message: &str) -> bool {
        conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True" && c.message == message)
    }

    /// `current` with these changes: a set condition keeps its transition time when its status did
    /// not change; the list is sorted by type.
    pub fn apply(&self, current: &[Condition]) -> Vec<Condition> {
        let mut out: Vec<Condition> = current.to_vec();
        for (type_, change) in &self.changes {
            let old = out.iter().find(|c| &c.type_ == type_).cloned();
            out.retain(|c| &c.type_ != type_);
            if let Change::Set {
                status,
                reason,
                message,
            } = change
            {
                let status_s = if *status { "True" } else { "False" };
                let time = match old {
                    Some(c) if c.status == status_s => c.last_transition_time,
                    _ => Time(Timestamp::now().round(Unit::Second).unwrap_or_default()),
                };
                out.push(Condition {
                    type_: type_.clone(),
                    status: status_s.into(),
                    reason: reason.clone(),
                    message: message.clone(),
                    last_transition_time: time,
                    observed_generation: self.generation,
                });
            }
        }
        out.sort_by(|a, b| a.type_.cmp(&b.type_));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(t: &str, status: &str, msg: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: status.into(),
            reason: "R".into(),
            message: msg.into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: Some(1),
        }
    }

    #[test]
    fn changes_merge_into_other_writers_conditions() {
        let current = vec![cond("SiteCheck", "True", "theirs"), cond("Ready", "True", "old")];
        let mut c = ConditionChanges::new(Some(2));
        c.set("Ready", true, "AllPodsAvailable", "3/3");
        c.set("ReplicaFailure", true, "FailedCreate", "boom");
        c.clear("InvalidSpec");
        let out = c.apply(&current);
        let types: Vec<&str> = out.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "ReplicaFailure", "SiteCheck"]);
        assert_eq!(out[2].message, "theirs", "another writer's condition is kept");
        assert_eq!(out[0].message, "3/3");
        assert_eq!(
            out[0].last_transition_time.0,
            Timestamp::UNIX_EPOCH,
            "same status: transition time kept"
        );
        assert_ne!(out[1].last_transition_time.0, Timestamp::UNIX_EPOCH);
        assert_eq!(out[0].observed_generation, Some(2));
        let mut clear = ConditionChanges::new(Some(2));
        clear.clear("ReplicaFailure");
        assert_eq!(clear.apply(&out).len(), 2);
        assert!(ConditionChanges::already_true(&out, "ReplicaFailure", "boom"));
    }
}
