//! Conditions the host owns on its parents' status, as changes merged into what the API server
//! has: a status write retried after a 409 starts again from the fresh object, so conditions set
//! by other writers are kept and the host's own are set, kept or cleared on top. And the one way
//! every kind's status is written ([`write`], through the [`Writer`](super::writer::Writer)).

use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::{Timestamp, Unit},
};
use kube::{Api, Client, Resource};
use serde::{Serialize, de::DeserializeOwned};
use slinky_api::{
    Accounting, AccountingStatus, BuilderPlugin, BuilderPluginStatus, Controller, ControllerStatus, LoginSet,
    LoginSetStatus, NodeSet, NodeSetStatus, RestApi, RestApiStatus, Token, TokenStatus, conditions,
    failure::Failure,
};

use super::{Error, context::Core};

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

    /// Set `failure`'s condition True, with its reason and message.
    pub fn set_failure(&mut self, failure: &Failure) {
        self.set(failure.condition, true, failure.reason, failure.message.clone());
    }

    /// The failure that stopped a pass: its condition, and `Ready` False with its reason.
    pub fn set_problem(&mut self, failure: &Failure) {
        self.set_failure(failure);
        self.set(conditions::READY, false, failure.reason, failure.message.clone());
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

/// A parent whose status the host writes.
pub(crate) trait HasStatus:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug + Send + Sync
{
    /// Its status type.
    type Status: Serialize + PartialEq + Clone + Default + Send + Sync;

    /// Its status, as the object has it.
    fn status(&self) -> Option<&Self::Status>;

    /// The conditions of `status`.
    fn conditions_of(status: &Self::Status) -> &[Condition];

    /// Its conditions (none without a status).
    fn conditions(&self) -> &[Condition] {
        self.status().map(Self::conditions_of).unwrap_or_default()
    }

    /// The API of its kind, where it lives.
    fn api(&self, client: Client) -> Api<Self>;
}

/// Write `parent`'s status when it changed: `compute` gets the object as read (the cached one,
/// then after a 409 the one read afresh from the API) and its conditions with `changes` merged
/// in, and returns the status.
///
/// # Errors
/// The API error (a 409 is retried from a fresh read by the writer).
pub(crate) async fn write<P: HasStatus + 'static>(
    core: &Core,
    parent: &P,
    changes: &ConditionChanges,
    compute: impl Fn(&P, Vec<Condition>) -> P::Status + Send + Sync,
) -> Result<(), Error> {
    let api = parent.api(core.client.clone());
    core.writer
        .update_status(
            &api,
            parent,
            |obj: &P| compute(obj, changes.apply(obj.conditions())),
            |obj: &P| obj.status().cloned(),
        )
        .await?;
    Ok(())
}

macro_rules! namespaced_status {
    ($($kind:ty => $status:ty),+ $(,)?) => {$(
        impl HasStatus for $kind {
            type Status = $status;

            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }

            fn conditions_of(status: &$status) -> &[Condition] {
                &status.conditions
            }

            fn api(&self, client: Client) -> Api<Self> {
                Api::namespaced(client, self.meta().namespace.as_deref().unwrap_or_default())
            }
        }
    )+};
}

namespaced_status!(
    Controller => ControllerStatus,
    NodeSet => NodeSetStatus,
    RestApi => RestApiStatus,
    LoginSet => LoginSetStatus,
    Accounting => AccountingStatus,
    Token => TokenStatus,
);

impl HasStatus for BuilderPlugin {
    type Status = BuilderPluginStatus;

    fn status(&self) -> Option<&BuilderPluginStatus> {
        self.status.as_ref()
    }

    fn conditions_of(status: &BuilderPluginStatus) -> &[Condition] {
        &status.conditions
    }

    fn api(&self, client: Client) -> Api<Self> {
        Api::all(client)
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
        assert!(Failure::replica("FailedCreate", "boom").shown_in(&out));
    }
}
