//! A Deployment's status as a [`Pass`] works it out (`progress.go`, `sync.go`): the counts from
//! its ReplicaSets, the `Available`, `Progressing` and `ReplicaFailure` conditions as
//! `SetDeploymentCondition` keeps them, written when they change.

use serde_json::{Value, json};

use super::{Pass, spec_replicas, status_of};
use crate::{
    deployments::{MANAGER, int, key, now, s},
    store::{Op, Sub},
};

/// A condition as `NewDeploymentCondition` makes it.
pub(super) fn condition(kind: &str, status: &str, reason: &str, message: String) -> Value {
    let at = now();
    json!({"type": kind, "status": status, "lastUpdateTime": at, "lastTransitionTime": at,
        "reason": reason, "message": message})
}

pub(super) fn find_condition<'a>(status: &'a Value, kind: &str) -> Option<&'a Value> {
    status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == kind))
}

fn remove_condition(status: &mut Value, kind: &str) {
    if let Some(list) = status.get_mut("conditions").and_then(Value::as_array_mut) {
        list.retain(|c| c["type"] != kind);
        if list.is_empty()
            && let Some(m) = status.as_object_mut()
        {
            m.remove("conditions");
        }
    }
}

/// `SetDeploymentCondition`: a condition of the same status and reason stays as it is; one of
/// the same status keeps its transition time; the new one goes last.
pub(super) fn set_condition(status: &mut Value, mut c: Value) {
    let kind = c["type"].as_str().unwrap_or_default().to_string();
    if let Some(current) = find_condition(status, &kind) {
        if current["status"] == c["status"] && current["reason"] == c["reason"] {
            return;
        }
        if current["status"] == c["status"] {
            c["lastTransitionTime"] = current["lastTransitionTime"].clone();
        }
    }
    remove_condition(status, &kind);
    if !status.get("conditions").is_some_and(Value::is_array) {
        status["conditions"] = json!([]);
    }
    if let Some(list) = status["conditions"].as_array_mut() {
        list.push(c);
    }
}

/// `DeploymentTimedOut`: `Progressing` not updated for `deadline` seconds (and not complete).
fn timed_out(status: &Value, deadline: i64) -> bool {
    let Some(c) = find_condition(status, "Progressing") else {
        return false;
    };
    match c["reason"].as_str() {
        Some("NewReplicaSetAvailable") => false,
        Some("ProgressDeadlineExceeded") => true,
        _ => c["lastUpdateTime"]
            .as_str()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .is_some_and(|t| t.as_second() + deadline < k8s_openapi::jiff::Timestamp::now().as_second()),
    }
}

impl Pass<'_> {
    /// `checkPausedConditions`: Progressing `Unknown` when paused or resumed.
    pub(super) fn paused_conditions(&mut self) {
        if self.deadline.is_none() {
            return;
        }
        let reason = find_condition(&self.status, "Progressing").map(|c| c["reason"].clone());
        if reason.as_ref().is_some_and(|r| r == "ProgressDeadlineExceeded") {
            return;
        }
        let paused_before = reason.as_ref().is_some_and(|r| r == "DeploymentPaused");
        let paused = self.d.pointer("/spec/paused") == Some(&Value::Bool(true));
        if paused && !paused_before {
            let c = condition(
                "Progressing",
                "Unknown",
                "DeploymentPaused",
                "Deployment is paused".into(),
            );
            set_condition(&mut self.status, c);
        } else if !paused && paused_before {
            let c = condition(
                "Progressing",
                "Unknown",
                "DeploymentResumed",
                "Deployment is resumed".into(),
            );
            set_condition(&mut self.status, c);
        }
    }

    /// `calculateStatus`: the counts from the ReplicaSets' statuses, `Available`, the
    /// conditions so far and the collision count.
    pub(super) fn calculated_status(&self, new: Option<usize>) -> Value {
        let sum = |f: &str| self.sets.iter().map(|rs| status_of(rs, f)).sum::<i64>();
        let available = sum("availableReplicas");
        let total: i64 = self.sets.iter().map(spec_replicas).sum();
        let mut status = json!({});
        for (field, n) in [
            ("observedGeneration", int(self.d, "/metadata/generation", 0)),
            ("replicas", sum("replicas")),
            (
                "updatedReplicas",
                new.map_or(0, |n| status_of(&self.sets[n], "replicas")),
            ),
            ("readyReplicas", sum("readyReplicas")),
            ("availableReplicas", available),
            ("unavailableReplicas", (total - available).max(0)),
        ] {
            if n != 0 {
                status[field] = n.into();
            }
        }
        if let Some(c) = self.status.get("conditions") {
            status["conditions"] = c.clone();
        }
        if let Some(c) = self.status.get("collisionCount") {
            status["collisionCount"] = c.clone();
        }
        let c = if available >= self.replicas - self.max_unavailable() {
            condition(
                "Available",
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.".into(),
            )
        } else {
            condition(
                "Available",
                "False",
                "MinimumReplicasUnavailable",
                "Deployment does not have minimum availability.".into(),
            )
        };
        set_condition(&mut status, c);
        status
    }

    /// `DeploymentComplete`: every replica updated and available, the generation observed.
    pub(super) fn complete(&self, status: &Value) -> bool {
        let n = |f: &str| int(status, &format!("/{f}"), 0);
        n("updatedReplicas") == self.replicas
            && n("replicas") == self.replicas
            && n("availableReplicas") == self.replicas
            && n("observedGeneration") >= int(self.d, "/metadata/generation", 0)
    }

    /// `syncRolloutStatus`: the calculated status with `Progressing` (complete, progressing or
    /// timed out) and the ReplicaSets' `ReplicaFailure`.
    pub(super) fn sync_rollout_status(&mut self, new: Option<usize>) {
        let mut status = self.calculated_status(new);
        let rs_name = new.map(|n| s(&self.sets[n], "/metadata/name").to_string());
        let about = |what: &str| match &rs_name {
            Some(rs) => format!("ReplicaSet {rs:?} {what}"),
            None => format!("Deployment {:?} {what}", self.name),
        };
        match self.deadline {
            None => remove_condition(&mut status, "Progressing"),
            Some(deadline) => {
                let old = self.d.get("status").cloned().unwrap_or_else(|| json!({}));
                let current = find_condition(&self.status, "Progressing").cloned();
                let n = |st: &Value, f: &str| int(st, &format!("/{f}"), 0);
                let finished = n(&status, "replicas") == n(&status, "updatedReplicas")
                    && current
                        .as_ref()
                        .is_some_and(|c| c["reason"] == "NewReplicaSetAvailable");
                let progressed = n(&status, "updatedReplicas") > n(&old, "updatedReplicas")
                    || n(&status, "replicas") - n(&status, "updatedReplicas")
                        < n(&old, "replicas") - n(&old, "updatedReplicas")
                    || n(&status, "readyReplicas") > n(&old, "readyReplicas")
                    || n(&status, "availableReplicas") > n(&old, "availableReplicas");
                if finished {
                    // The rollout is over: nothing to estimate.
                } else if self.complete(&status) {
                    let message = about("has successfully progressed.");
                    let c = condition("Progressing", "True", "NewReplicaSetAvailable", message);
                    set_condition(&mut status, c);
                } else if progressed {
                    let mut c = condition(
                        "Progressing",
                        "True",
                        "ReplicaSetUpdated",
                        about("is progressing."),
                    );
                    if let Some(current) = &current {
                        if current["status"] == "True" {
                            c["lastTransitionTime"] = current["lastTransitionTime"].clone();
                        }
                        remove_condition(&mut status, "Progressing");
                    }
                    set_condition(&mut status, c);
                } else if timed_out(&status, deadline) {
                    let c = condition(
                        "Progressing",
                        "False",
                        "ProgressDeadlineExceeded",
                        about("has timed out progressing."),
                    );
                    set_condition(&mut status, c);
                }
            }
        }
        // The new ReplicaSet's failure first, else an old one's.
        let failure = new
            .into_iter()
            .chain(0..self.sets.len())
            .filter_map(|i| find_condition(self.sets[i].get("status")?, "ReplicaFailure"))
            .next()
            .cloned();
        match failure {
            Some(f) => {
                let c = json!({"type": "ReplicaFailure", "status": f["status"], "reason": f["reason"],
                    "message": f["message"], "lastUpdateTime": f["lastTransitionTime"],
                    "lastTransitionTime": f["lastTransitionTime"]});
                set_condition(&mut status, c);
            }
            None => remove_condition(&mut status, "ReplicaFailure"),
        }
        self.status = status;
        self.write_status();
    }

    /// Write the status worked out, when it changed.
    pub(super) fn write_status(&self) {
        if self.d.get("status") == Some(&self.status) {
            return;
        }
        let status = self.status.clone();
        let result = self.store.modify(
            &key("apps", "deployments"),
            &self.ns,
            &self.name,
            Sub::Status,
            MANAGER,
            Op::Update,
            |cur, _| {
                let mut d = cur.clone();
                d["status"] = status;
                Ok(d)
            },
        );
        if let Err(error) = result {
            tracing::debug!(deployment = self.name, %error, "cannot write a Deployment's status");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_times_unless_it_changes() {
        let mut status = json!({"conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable",
             "lastUpdateTime": "t0", "lastTransitionTime": "t0"}]});
        set_condition(
            &mut status,
            condition("Available", "False", "MinimumReplicasUnavailable", "m".into()),
        );
        assert_eq!(status["conditions"][0]["lastUpdateTime"], "t0");
        set_condition(
            &mut status,
            condition("Progressing", "True", "NewReplicaSetCreated", "m".into()),
        );
        set_condition(
            &mut status,
            condition("Available", "True", "MinimumReplicasAvailable", "m".into()),
        );
        let kinds: Vec<&str> = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["type"].as_str())
            .collect();
        assert_eq!(
            kinds,
            ["Progressing", "Available"],
            "a changed condition goes last"
        );
        assert_ne!(status["conditions"][1]["lastTransitionTime"], "t0");
    }
}
