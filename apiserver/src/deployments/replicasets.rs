//! The simulated replica set controller (`pkg/controller/replicaset`): each ReplicaSet gets
//! `spec.replicas` active pods from its template, named `<replicaset>-<random>` and controlled by
//! it; extra pods are deleted, the least valuable first; the status counts the pods.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{MANAGER, controlled_by, controller_ref, int, key, now, pod_available, s};
use crate::{
    DeleteOpts, Store,
    recorder::{self, Regarding, Said},
    store::{Op, Sub},
};

/// The component of the Events.
const COMPONENT: &str = "replicaset-controller";

/// One pass over every ReplicaSet (those being deleted are left to the garbage collector).
pub(super) fn sync(store: &Arc<Store>) {
    let Ok((sets, _, _)) = store.list(&key("apps", "replicasets"), "", &|_| true, None, 0) else {
        return;
    };
    for rs in sets {
        if rs.pointer("/metadata/deletionTimestamp").is_none() {
            sync_one(store, &rs);
        }
    }
}

/// Whether a pod counts for its ReplicaSet (`controller.IsPodActive`): not finished, not being
/// deleted.
fn active(pod: &Value) -> bool {
    pod.pointer("/metadata/deletionTimestamp").is_none()
        && !matches!(s(pod, "/status/phase"), "Succeeded" | "Failed")
}

/// The pods of a ReplicaSet in the order they are deleted (`controller.ActivePods`): not yet
/// scheduled before scheduled, pending before running, not ready before ready, newer before
/// older.
fn deletion_order(pods: &mut [Arc<Value>]) {
    pods.sort_by_key(|p| {
        let scheduled = !s(p, "/spec/nodeName").is_empty();
        let phase = match s(p, "/status/phase") {
            "Pending" => 0,
            "Unknown" => 1,
            "Running" => 2,
            _ => 3,
        };
        let ready = slinky_api::pods::json_is_ready(p);
        let created = std::cmp::Reverse(s(p, "/metadata/creationTimestamp").to_string());
        (scheduled, phase, ready, created)
    });
}

/// The pod a ReplicaSet makes from its template (`controller.GetPodFromTemplate`).
fn pod_for(rs: &Value) -> Value {
    let template = rs.pointer("/spec/template").cloned().unwrap_or(Value::Null);
    let mut meta = json!({
        "generateName": format!("{}-", s(rs, "/metadata/name")),
        "namespace": s(rs, "/metadata/namespace"),
        "ownerReferences": [controller_ref(rs, "ReplicaSet")],
    });
    for field in ["labels", "annotations", "finalizers"] {
        if let Some(v) = template
            .pointer(&format!("/metadata/{field}"))
            .filter(|v| !v.is_null())
        {
            meta[field] = v.clone();
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": template.get("spec").cloned().unwrap_or_else(|| json!({}))})
}

/// Create or delete pods until `spec.replicas` are active, then write the status.
fn sync_one(store: &Store, rs: &Value) {
    let ns = s(rs, "/metadata/namespace");
    let uid = s(rs, "/metadata/uid");
    let pods_of = || {
        store
            .list(&key("", "pods"), ns, &|p| controlled_by(p, uid), None, 0)
            .map(|(pods, _, _)| pods.into_iter().filter(|p| active(p)).collect::<Vec<_>>())
    };
    let Ok(mut pods) = pods_of() else {
        return;
    };
    let on = Regarding {
        api_version: "apps/v1",
        kind: "ReplicaSet",
        namespace: ns,
        name: s(rs, "/metadata/name"),
        uid,
    };
    let event = |kind: &str, reason: &str, message: &str| {
        let said = Said {
            kind,
            reason,
            message,
        };
        recorder::record(store, COMPONENT, MANAGER, on, said);
    };
    let want = int(rs, "/spec/replicas", 1).max(0) as usize;
    let mut failure = None;
    if pods.len() < want {
        for _ in pods.len()..want {
            match store.create(&key("", "pods"), ns, pod_for(rs), MANAGER, false) {
                Ok(pod) => event(
                    "Normal",
                    "SuccessfulCreate",
                    &format!("Created pod: {}", s(&pod, "/metadata/name")),
                ),
                Err(error) => {
                    tracing::debug!(replicaset = on.name, %error, "cannot create a ReplicaSet's pod");
                    event(
                        "Warning",
                        "FailedCreate",
                        &format!("Error creating: {}", error.message),
                    );
                    failure = Some(("FailedCreate", error.message));
                    break;
                }
            }
        }
    } else if pods.len() > want {
        deletion_order(&mut pods);
        for pod in &pods[..pods.len() - want] {
            let name = s(pod, "/metadata/name");
            let opts = DeleteOpts {
                uid: Some(s(pod, "/metadata/uid").to_string()),
                ..Default::default()
            };
            match store.delete(&key("", "pods"), ns, name, &opts) {
                Ok(_) => event("Normal", "SuccessfulDelete", &format!("Deleted pod: {name}")),
                Err(error) if error.code == 404 => {}
                Err(error) => {
                    event(
                        "Warning",
                        "FailedDelete",
                        &format!("Error deleting: {}", error.message),
                    );
                    failure = Some(("FailedDelete", error.message));
                    break;
                }
            }
        }
    }
    // The status counts the pods as they are now (the real controller counts them on its
    // next sync, which the pod changes trigger at once).
    if let Ok(pods) = pods_of() {
        write_status(store, rs, &pods, failure);
    }
}

/// `calculateStatus` of a ReplicaSet, written when it changed. `failure` is what went wrong
/// creating or deleting pods this pass (the `ReplicaFailure` condition), if anything.
fn write_status(store: &Store, rs: &Value, pods: &[Arc<Value>], failure: Option<(&str, String)>) {
    let min_ready = int(rs, "/spec/minReadySeconds", 0);
    let at = k8s_openapi::jiff::Timestamp::now();
    let template_labels = rs
        .pointer("/spec/template/metadata/labels")
        .and_then(Value::as_object);
    let fully_labeled = pods
        .iter()
        .filter(|p| {
            template_labels
                .into_iter()
                .flatten()
                .all(|(k, v)| p.pointer("/metadata/labels").and_then(|l| l.get(k)) == Some(v))
        })
        .count();
    let ready = pods.iter().filter(|p| slinky_api::pods::json_is_ready(p)).count();
    let available = pods.iter().filter(|p| pod_available(p, min_ready, at)).count();
    let mut status = json!({"replicas": pods.len()});
    for (field, n) in [
        ("fullyLabeledReplicas", fully_labeled as i64),
        ("readyReplicas", ready as i64),
        ("availableReplicas", available as i64),
        ("observedGeneration", int(rs, "/metadata/generation", 0)),
    ] {
        if n != 0 {
            status[field] = n.into();
        }
    }
    let before: Vec<Value> = rs
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let old_failure = before.iter().find(|c| c["type"] == "ReplicaFailure");
    let conditions: Vec<Value> = match (failure, old_failure) {
        // A failure already recorded stays as it was.
        (Some(_), Some(_)) => before.clone(),
        (Some((reason, message)), None) => {
            let mut c = before.clone();
            c.push(
                json!({"type": "ReplicaFailure", "status": "True", "lastTransitionTime": now(),
                "reason": reason, "message": message}),
            );
            c
        }
        (None, _) => before
            .into_iter()
            .filter(|c| c["type"] != "ReplicaFailure")
            .collect(),
    };
    if !conditions.is_empty() {
        status["conditions"] = conditions.into();
    }
    if rs.get("status") == Some(&status) {
        return;
    }
    let result = store.modify(
        &key("apps", "replicasets"),
        s(rs, "/metadata/namespace"),
        s(rs, "/metadata/name"),
        Sub::Status,
        MANAGER,
        Op::Update,
        |cur, _| {
            let mut o = cur.clone();
            o["status"] = status;
            Ok(o)
        },
    );
    if let Err(error) = result {
        tracing::debug!(replicaset = s(rs, "/metadata/name"), %error, "cannot write a ReplicaSet's status");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_come_from_the_template_and_go_least_valuable_first() {
        let rs = json!({"metadata": {"name": "web-5d9c", "namespace": "n", "uid": "u"},
            "spec": {"template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "5d9c"}},
                "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let pod = pod_for(&rs);
        assert_eq!(pod["metadata"]["generateName"], "web-5d9c-");
        assert_eq!(pod["metadata"]["labels"]["pod-template-hash"], "5d9c");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");
        assert_eq!(pod["metadata"]["ownerReferences"][0]["controller"], true);
        assert!(pod["metadata"].get("annotations").is_none());
        let p = |name: &str, node: &str, phase: &str, created: &str| {
            Arc::new(json!({"metadata": {"name": name, "creationTimestamp": created},
                "spec": {"nodeName": node}, "status": {"phase": phase}}))
        };
        let mut pods = vec![
            p("old-running", "n1", "Running", "2026-01-01T00:00:00Z"),
            p("new-running", "n1", "Running", "2026-01-01T00:00:05Z"),
            p("pending", "n1", "Pending", "2026-01-01T00:00:00Z"),
            p("unscheduled", "", "Pending", "2026-01-01T00:00:00Z"),
        ];
        deletion_order(&mut pods);
        let order: Vec<&str> = pods.iter().map(|p| s(p, "/metadata/name")).collect();
        assert_eq!(order, ["unscheduled", "pending", "new-running", "old-running"]);
    }
}
