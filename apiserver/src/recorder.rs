//! The Events of the simulated controllers, as kube-controller-manager's recorder makes them: a
//! core Event from the controller's component regarding an object, repeats (same object,
//! reason and message) folded into one Event whose `count` grows.

use serde_json::json;

use crate::{
    ResKey, Store,
    store::{Op, Sub},
};

/// The object an Event is about.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Regarding<'a> {
    /// `apps/v1`.
    pub(crate) api_version: &'a str,
    /// `StatefulSet`, `Deployment`, `ReplicaSet`.
    pub(crate) kind: &'a str,
    /// Its namespace.
    pub(crate) namespace: &'a str,
    /// Its name.
    pub(crate) name: &'a str,
    /// Its uid.
    pub(crate) uid: &'a str,
}

/// What an Event says: `Normal` or `Warning`, its reason and message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Said<'a> {
    /// `Normal` or `Warning`.
    pub(crate) kind: &'a str,
    /// `FailedCreate`, `ScalingReplicaSet`, …
    pub(crate) reason: &'a str,
    /// The message.
    pub(crate) message: &'a str,
}

/// Record an Event from `component` (written by `manager`) regarding `on`.
pub(crate) fn record(store: &Store, component: &str, manager: &str, on: Regarding<'_>, said: Said<'_>) {
    use std::hash::{Hash, Hasher};
    let events = ResKey {
        group: String::new(),
        plural: "events".into(),
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (on.uid, said.kind, said.reason, said.message).hash(&mut h);
    let name = format!("{}.{:016x}", on.name, h.finish());
    let now = k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let folded = store.modify(
        &events,
        on.namespace,
        &name,
        Sub::Main,
        manager,
        Op::Server,
        |cur, _| {
            let mut e = cur.clone();
            e["count"] = (cur["count"].as_i64().unwrap_or(1) + 1).into();
            e["lastTimestamp"] = now.clone().into();
            Ok(e)
        },
    );
    if folded.is_ok() {
        return;
    }
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": on.namespace},
        "involvedObject": {"apiVersion": on.api_version, "kind": on.kind, "name": on.name,
            "namespace": on.namespace, "uid": on.uid},
        "reason": said.reason, "message": said.message, "type": said.kind, "count": 1,
        "source": {"component": component},
        "firstTimestamp": now, "lastTimestamp": now, "reportingComponent": component});
    if let Err(error) = store.create(&events, on.namespace, event, manager, false) {
        tracing::debug!(kind = on.kind, name = on.name, %error, "cannot record an Event");
    }
}
