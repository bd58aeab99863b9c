//! The simulated deployment controller (`pkg/controller/deployment` of kube-controller-manager
//! v1.28): `syncDeployment` for each Deployment — its ReplicaSets found (the one whose template
//! is the Deployment's is the new one) or created, the revision kept, then a scaling event, a
//! paused Deployment, a `Recreate` or a `RollingUpdate` rollout, the cleanup of old ReplicaSets,
//! and the status with its conditions. A [`Pass`] is one Deployment's sync: what it finds and
//! writes here, how it scales and rolls in [`strategies`], its status in [`status`].

mod status;
mod strategies;

use std::sync::Arc;

use serde_json::{Value, json};

use self::status::{condition, find_condition, set_condition};
use super::{
    HASH_LABEL, MANAGER, REVISION, controlled_by, controller_ref, int, key, s, template_hash, without_hash,
};
use crate::{
    DeleteOpts, Store,
    recorder::{self, Regarding, Said},
    store::{Op, Sub},
};

const DESIRED: &str = "deployment.kubernetes.io/desired-replicas";
const MAX_REPLICAS: &str = "deployment.kubernetes.io/max-replicas";
const REVISION_HISTORY: &str = "deployment.kubernetes.io/revision-history";
/// Deployment annotations not copied to its ReplicaSets.
const NOT_COPIED: [&str; 6] = [
    "kubectl.kubernetes.io/last-applied-configuration",
    REVISION,
    REVISION_HISTORY,
    DESIRED,
    MAX_REPLICAS,
    "deprecated.deployment.rollback.to",
];
/// The length limit of `revision-history` (kube-controller-manager's default).
const MAX_REVISION_HISTORY_CHARS: usize = 2000;

/// One pass over every Deployment (those being deleted are left to the garbage collector).
pub(super) fn sync(store: &Arc<Store>) {
    let Ok((items, _, _)) = store.list(&key("apps", "deployments"), "", &|_| true, None, 0) else {
        return;
    };
    for d in items {
        if d.pointer("/metadata/deletionTimestamp").is_none() {
            Pass::of(store, &d).run();
        }
    }
}

/// `intstr.GetScaledValueFromIntOrPercent`: a number, or a percentage of `total` rounded up or
/// down.
fn scaled(v: Option<&Value>, default_percent: i64, total: i64, round_up: bool) -> i64 {
    let percent = |p: i64| {
        let product = p * total;
        if round_up {
            (product + 99) / 100
        } else {
            product / 100
        }
    };
    match v {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(t)) => t
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(0, percent),
        _ => percent(default_percent),
    }
}

/// The replicas of a ReplicaSet's spec (`*rs.Spec.Replicas`).
pub(super) fn spec_replicas(rs: &Value) -> i64 {
    int(rs, "/spec/replicas", 1)
}

fn status_of(rs: &Value, field: &str) -> i64 {
    int(rs, &format!("/status/{field}"), 0)
}

fn revision_of(rs: &Value) -> i64 {
    rs.pointer(&format!("/metadata/annotations/{}", REVISION.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

fn annotation<'a>(obj: &'a Value, name: &str) -> Option<&'a str> {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(name))
        .and_then(Value::as_str)
}

fn set_annotation(obj: &mut Value, name: &str, value: String) {
    if !obj.pointer("/metadata/annotations").is_some_and(Value::is_object) {
        obj["metadata"]["annotations"] = json!({});
    }
    obj["metadata"]["annotations"][name] = value.into();
}

/// One Deployment being synced: what it asks for, its ReplicaSets (kept up to date with this
/// pass's writes) and the status being worked out.
struct Pass<'a> {
    store: &'a Store,
    d: &'a Value,
    ns: String,
    name: String,
    uid: String,
    /// `spec.replicas`.
    replicas: i64,
    /// `Recreate` (else `RollingUpdate`).
    recreate: bool,
    /// The `RollingUpdate` fenceposts (maxSurge, maxUnavailable) for `replicas`.
    surge: i64,
    unavailable: i64,
    /// `progressDeadlineSeconds`, when set (the default is 600).
    deadline: Option<i64>,
    /// Its ReplicaSets, oldest first.
    sets: Vec<Value>,
    /// The status as this pass makes it (starting from the stored one).
    status: Value,
}

impl<'a> Pass<'a> {
    fn of(store: &'a Store, d: &'a Value) -> Self {
        let replicas = int(d, "/spec/replicas", 1);
        let recreate = s(d, "/spec/strategy/type") == "Recreate";
        let rolling = d.pointer("/spec/strategy/rollingUpdate");
        let field = |f: &str| rolling.and_then(|r| r.get(f)).filter(|v| !v.is_null());
        let (mut surge, mut unavailable) = (
            scaled(field("maxSurge"), 25, replicas, true),
            scaled(field("maxUnavailable"), 25, replicas, false),
        );
        if recreate {
            (surge, unavailable) = (0, 0);
        } else if surge == 0 && unavailable == 0 {
            unavailable = 1;
        }
        let deadline = match d.pointer("/spec/progressDeadlineSeconds") {
            Some(Value::Number(n)) => n.as_i64().filter(|&n| n != i64::from(i32::MAX)),
            _ => Some(600),
        };
        let uid = s(d, "/metadata/uid").to_string();
        let ns = s(d, "/metadata/namespace").to_string();
        let mut sets: Vec<Value> = store
            .list(
                &key("apps", "replicasets"),
                &ns,
                &|rs| controlled_by(rs, &uid),
                None,
                0,
            )
            .map(|(items, _, _)| items.iter().map(|rs| (**rs).clone()).collect())
            .unwrap_or_default();
        sets.sort_by(|a, b| {
            (s(a, "/metadata/creationTimestamp"), s(a, "/metadata/name"))
                .cmp(&(s(b, "/metadata/creationTimestamp"), s(b, "/metadata/name")))
        });
        Pass {
            store,
            d,
            name: s(d, "/metadata/name").to_string(),
            ns,
            uid,
            replicas,
            recreate,
            surge,
            unavailable,
            deadline,
            sets,
            status: d.get("status").cloned().unwrap_or_else(|| json!({})),
        }
    }

    /// `MaxUnavailable`: at most `replicas`, none for `Recreate` or no replicas.
    fn max_unavailable(&self) -> i64 {
        if self.recreate || self.replicas == 0 {
            0
        } else {
            self.unavailable.min(self.replicas)
        }
    }

    /// `syncDeployment`.
    fn run(mut self) {
        self.paused_conditions();
        if self.d.pointer("/spec/paused") == Some(&Value::Bool(true)) {
            self.scale_only(true);
        } else if self.is_scaling_event() {
            self.scale_only(false);
        } else if self.recreate {
            self.rollout_recreate();
        } else {
            self.rollout_rolling();
        }
    }

    fn event(&self, kind: &str, reason: &str, message: &str) {
        let on = Regarding {
            api_version: "apps/v1",
            kind: "Deployment",
            namespace: &self.ns,
            name: &self.name,
            uid: &self.uid,
        };
        recorder::record(
            self.store,
            "deployment-controller",
            MANAGER,
            on,
            Said {
                kind,
                reason,
                message,
            },
        );
    }

    /// The index of the new ReplicaSet (the oldest whose template is the Deployment's).
    fn new_index(&self) -> Option<usize> {
        let template = without_hash(self.d.pointer("/spec/template").unwrap_or(&Value::Null));
        self.sets
            .iter()
            .position(|rs| without_hash(rs.pointer("/spec/template").unwrap_or(&Value::Null)) == template)
    }

    /// The ReplicaSets other than the new one.
    fn old_indices(&self, new: Option<usize>) -> Vec<usize> {
        (0..self.sets.len()).filter(|&i| Some(i) != new).collect()
    }

    /// Write a ReplicaSet (an update by kube-controller-manager) and keep the result.
    fn update_set(&mut self, i: usize, f: impl FnOnce(&mut Value)) -> bool {
        let rs_name = s(&self.sets[i], "/metadata/name").to_string();
        let result = self.store.modify(
            &key("apps", "replicasets"),
            &self.ns,
            &rs_name,
            Sub::Main,
            MANAGER,
            Op::Update,
            |cur, _| {
                let mut o = cur.clone();
                f(&mut o);
                Ok(o)
            },
        );
        match result {
            Ok(rs) => {
                self.sets[i] = (*rs).clone();
                true
            }
            Err(error) => {
                tracing::debug!(replicaset = rs_name, %error, "cannot update a Deployment's ReplicaSet");
                false
            }
        }
    }

    /// `getNewReplicaSet` (with `getAllReplicaSetsAndSyncRevision`): the new ReplicaSet's
    /// annotations and revision brought up to date, or it created when `create`.
    fn new_set(&mut self, create: bool) -> Option<usize> {
        let new = self.new_index();
        let max_old = self
            .old_indices(new)
            .iter()
            .map(|&i| revision_of(&self.sets[i]))
            .max()
            .unwrap_or(0);
        let revision = max_old + 1;
        match new {
            Some(i) => {
                let (changed, updated) = self.annotated(&self.sets[i], revision, true);
                let min_ready = int(self.d, "/spec/minReadySeconds", 0);
                if changed || int(&self.sets[i], "/spec/minReadySeconds", 0) != min_ready {
                    self.update_set(i, |rs| {
                        rs["metadata"]["annotations"] = updated["metadata"]["annotations"].clone();
                        rs["spec"]["minReadySeconds"] = min_ready.into();
                    });
                    return Some(i);
                }
                let rs_revision = annotation(&self.sets[i], REVISION)
                    .unwrap_or_default()
                    .to_string();
                self.set_revision(&rs_revision);
                if self.deadline.is_some() && find_condition(&self.status, "Progressing").is_none() {
                    let message = format!("Found new replica set {:?}", s(&self.sets[i], "/metadata/name"));
                    set_condition(
                        &mut self.status,
                        condition("Progressing", "True", "FoundNewReplicaSet", message),
                    );
                }
                Some(i)
            }
            None if create => self.create_set(revision),
            None => None,
        }
    }

    /// `SetNewReplicaSetAnnotations`: `rs` with the Deployment's annotations, the revision
    /// (when higher, the replaced one kept in `revision-history`) and, for a ReplicaSet being
    /// created, the replica annotations; and whether anything changed.
    fn annotated(&self, rs: &Value, revision: i64, exists: bool) -> (bool, Value) {
        let mut rs = rs.clone();
        let mut changed = false;
        for (k, v) in self
            .d
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let v = v.as_str().unwrap_or_default();
            if NOT_COPIED.contains(&k.as_str()) || annotation(&rs, k) == Some(v) {
                continue;
            }
            set_annotation(&mut rs, k, v.to_string());
            changed = true;
        }
        let old = annotation(&rs, REVISION).map(str::to_string);
        let old_number = old.as_deref().map_or(Some(0), |o| o.parse::<i64>().ok());
        if let Some(old_number) = old_number
            && old_number < revision
        {
            set_annotation(&mut rs, REVISION, revision.to_string());
            changed = true;
            if let Some(old) = old {
                let history = annotation(&rs, REVISION_HISTORY).unwrap_or_default().to_string();
                let mut list: Vec<&str> = history.split(',').filter(|r| !r.is_empty()).collect();
                list.push(&old);
                while list.join(",").len() > MAX_REVISION_HISTORY_CHARS && list.len() > 1 {
                    list.remove(0);
                }
                set_annotation(&mut rs, REVISION_HISTORY, list.join(","));
            }
        }
        if !exists {
            changed |= self.replica_annotations(&mut rs);
        }
        (changed, rs)
    }

    /// `SetReplicasAnnotations`: `desired-replicas` and `max-replicas`; whether they changed.
    fn replica_annotations(&self, rs: &mut Value) -> bool {
        let desired = self.replicas.to_string();
        let max = (self.replicas + self.surge).to_string();
        let mut changed = false;
        for (name, value) in [(DESIRED, desired), (MAX_REPLICAS, max)] {
            if annotation(rs, name) != Some(value.as_str()) {
                set_annotation(rs, name, value);
                changed = true;
            }
        }
        changed
    }

    /// The Deployment's own revision annotation (`SetDeploymentRevision`), written when it
    /// changes.
    fn set_revision(&mut self, revision: &str) {
        if annotation(self.d, REVISION) == Some(revision) {
            return;
        }
        let revision = revision.to_string();
        let result = self.store.modify(
            &key("apps", "deployments"),
            &self.ns,
            &self.name,
            Sub::Main,
            MANAGER,
            Op::Update,
            |cur, _| {
                let mut d = cur.clone();
                set_annotation(&mut d, REVISION, revision);
                Ok(d)
            },
        );
        if let Err(error) = result {
            tracing::debug!(deployment = self.name, %error, "cannot write a Deployment's revision");
        }
    }

    /// Create the ReplicaSet of the Deployment's template (a hash collision with another
    /// template bumps `collisionCount`; the next pass retries).
    fn create_set(&mut self, revision: i64) -> Option<usize> {
        let template = self.d.pointer("/spec/template").cloned().unwrap_or(Value::Null);
        let collisions = self.status.get("collisionCount").and_then(Value::as_i64);
        let hash = template_hash(&template, collisions);
        let rs_name = format!("{}-{hash}", self.name);
        let mut labels = template
            .pointer("/metadata/labels")
            .cloned()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        labels[HASH_LABEL] = hash.clone().into();
        let mut rs_template = template.clone();
        rs_template["metadata"]["labels"] = labels.clone();
        let mut selector = self
            .d
            .pointer("/spec/selector")
            .cloned()
            .unwrap_or_else(|| json!({}));
        if !selector.get("matchLabels").is_some_and(Value::is_object) {
            selector["matchLabels"] = json!({});
        }
        selector["matchLabels"][HASH_LABEL] = hash.into();
        let mut spec = json!({"replicas": 0, "selector": selector, "template": rs_template});
        if let Some(m) = self.d.pointer("/spec/minReadySeconds") {
            spec["minReadySeconds"] = m.clone();
        }
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": rs_name, "namespace": self.ns, "labels": labels,
                "ownerReferences": [controller_ref(self.d, "Deployment")]},
            "spec": spec});
        // `NewRSNewReplicas` with the ReplicaSet at 0 among the others.
        let replicas = if self.recreate {
            self.replicas
        } else {
            let total: i64 = self.sets.iter().map(spec_replicas).sum();
            let room = self.replicas + self.surge - total;
            if room <= 0 { 0 } else { room.min(self.replicas) }
        };
        let (_, mut rs) = self.annotated(&rs, revision, false);
        rs["spec"]["replicas"] = replicas.into();
        match self
            .store
            .create(&key("apps", "replicasets"), &self.ns, rs, MANAGER, false)
        {
            Ok(created) => {
                self.sets.push((*created).clone());
                if replicas > 0 {
                    self.event(
                        "Normal",
                        "ScalingReplicaSet",
                        &format!("Scaled up replica set {rs_name} to {replicas}"),
                    );
                }
                self.set_revision(&revision.to_string());
                if self.deadline.is_some() {
                    let message = format!("Created new replica set {rs_name:?}");
                    set_condition(
                        &mut self.status,
                        condition("Progressing", "True", "NewReplicaSetCreated", message),
                    );
                }
                Some(self.sets.len() - 1)
            }
            Err(error) if error.code == 409 => {
                // Not ours, or another template: a hash collision.
                let ours = self
                    .store
                    .get(&key("apps", "replicasets"), &self.ns, &rs_name)
                    .is_ok_and(|rs| {
                        controlled_by(&rs, &self.uid)
                            && without_hash(rs.pointer("/spec/template").unwrap_or(&Value::Null))
                                == without_hash(&template)
                    });
                if !ours {
                    self.status["collisionCount"] = (collisions.unwrap_or(0) + 1).into();
                    self.write_status();
                }
                None
            }
            Err(error) => {
                let message = format!("Failed to create new replica set {rs_name:?}: {}", error.message);
                tracing::debug!(deployment = self.name, %error, "cannot create a ReplicaSet");
                if self.deadline.is_some() {
                    let c = condition("Progressing", "False", "ReplicaSetCreateError", message.clone());
                    set_condition(&mut self.status, c);
                    self.write_status();
                }
                self.event("Warning", "ReplicaSetCreateError", &message);
                None
            }
        }
    }

    /// `scaleReplicaSetAndRecordEvent` (and `scaleReplicaSet`): the ReplicaSet at `scale` with
    /// up-to-date replica annotations; whether its size changed.
    fn scale_set(&mut self, i: usize, scale: i64) -> bool {
        let before = spec_replicas(&self.sets[i]);
        if before == scale {
            return false;
        }
        let direction = if before < scale { "up" } else { "down" };
        self.scale_set_as(i, scale, direction)
    }

    fn scale_set_as(&mut self, i: usize, scale: i64, direction: &str) -> bool {
        let before = spec_replicas(&self.sets[i]);
        let mut annotated = self.sets[i].clone();
        let annotations_changed = self.replica_annotations(&mut annotated);
        if before == scale && !annotations_changed {
            return false;
        }
        let annotations = annotated["metadata"]["annotations"].clone();
        let written = self.update_set(i, |rs| {
            rs["spec"]["replicas"] = scale.into();
            rs["metadata"]["annotations"] = annotations;
        });
        if written && before != scale {
            let rs_name = s(&self.sets[i], "/metadata/name").to_string();
            self.event(
                "Normal",
                "ScalingReplicaSet",
                &format!("Scaled {direction} replica set {rs_name} to {scale} from {before}"),
            );
            return true;
        }
        false
    }

    /// `cleanupDeployment`: old ReplicaSets past `revisionHistoryLimit`, the lowest revisions
    /// first, deleted once they have no pods.
    fn cleanup(&mut self, new: Option<usize>) {
        let limit = int(self.d, "/spec/revisionHistoryLimit", 10);
        let mut old: Vec<&Value> = self
            .old_indices(new)
            .into_iter()
            .map(|i| &self.sets[i])
            .filter(|rs| rs.pointer("/metadata/deletionTimestamp").is_none())
            .collect();
        let extra = old.len() as i64 - limit;
        if extra <= 0 {
            return;
        }
        old.sort_by_key(|rs| (revision_of(rs), s(rs, "/metadata/creationTimestamp").to_string()));
        for rs in old.into_iter().take(extra as usize) {
            let busy = status_of(rs, "replicas") != 0
                || spec_replicas(rs) != 0
                || int(rs, "/metadata/generation", 0) > status_of(rs, "observedGeneration");
            if busy {
                continue;
            }
            let opts = DeleteOpts::default();
            if let Err(error) = self.store.delete(
                &key("apps", "replicasets"),
                &self.ns,
                s(rs, "/metadata/name"),
                &opts,
            ) && error.code != 404
            {
                tracing::debug!(deployment = self.name, %error, "cannot delete an old ReplicaSet");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fenceposts_round_as_kubernetes_does() {
        assert_eq!(scaled(None, 25, 3, true), 1);
        assert_eq!(scaled(None, 25, 3, false), 0);
        assert_eq!(scaled(Some(&json!("50%")), 25, 5, true), 3);
        assert_eq!(scaled(Some(&json!("50%")), 25, 5, false), 2);
        assert_eq!(scaled(Some(&json!(2)), 25, 5, false), 2);
    }
}
