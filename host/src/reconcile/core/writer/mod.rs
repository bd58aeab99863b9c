//! The writer: the only code that writes to the API server (children here, pods, claims and
//! revisions in [`pods`], status, finalizers and labels in [`status`]).
//!
//! * Children other than pods (Services, ConfigMaps, StatefulSets, PodDisruptionBudgets) are
//!   server-side applied with the host's field manager, forced over the version whose ownership
//!   was checked (a user's edit of a host-owned field is taken back, an object replaced meanwhile
//!   is a 409). They are created with a create (an object someone made meanwhile is a 409
//!   AlreadyExists, never merged into), then applied over that version, and the create's Update
//!   entry is dropped from managedFields after the apply: the host's fields are owned by its
//!   Apply entry alone, so a field a builder stops building is removed. They are deleted with a
//!   UID precondition.
//! * Pods are created (in Kubernetes' protobuf encoding, as kube-controller-manager creates
//!   them, while the server takes it and the schema carries every field of the pod; else as
//!   JSON), and deleted with a UID precondition (never a namesake); adoption, release and
//!   relabelling patch with a resourceVersion precondition.
//! * A NodeSet's ControllerRevisions are created (a 409 AlreadyExists when the name is taken),
//!   patched (their `revision` number, owners, labels) with a resourceVersion precondition, and
//!   deleted with a UID precondition.
//! * Status is written only when it changed, as a merge patch carrying the resourceVersion it was
//!   computed from; a 409 is retried from a fresh read of the API (not the cache) with jittered
//!   backoff, a bounded number of times.
//! * Every write is fenced: made only while this replica may write
//!   ([`super::Leadership::fence`]), and bounded by [`super::Leadership::write_timeout`] (with
//!   leader election, half the fence's margin): a write still unanswered then is abandoned (the
//!   connection dropped, counted as `timeout`), so none leaves this process after the Lease could
//!   have passed to another replica.
//! * Every write is counted by verb and outcome (`create` counts pods, `create_child` the
//!   other children, `create_revision`/`patch_revision`/`delete_revision` ControllerRevisions).

use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::api::{
    apps::v1::ControllerRevision,
    core::v1::{PersistentVolumeClaim, Pod, Toleration},
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions},
};

use crate::{metrics::WriteMetrics, plugins::ChildKind};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

mod pods;
mod status;

/// The host's field manager.
pub const FIELD_MANAGER: &str = "slinky-host";
/// Attempts of a conflict-retried status write.
pub const STATUS_ATTEMPTS: u32 = 8;

/// The outcome label of a write: `ok`, `conflict`, `not_found`, `timeout` (abandoned after the
/// write timeout), `not_leader` or `error`.
pub(crate) fn outcome(r: &Result<impl Sized, kube::Error>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(kube::Error::Api(s)) if s.code == 409 => "conflict",
        Err(kube::Error::Api(s)) if s.code == 404 => "not_found",
        Err(kube::Error::Service(e)) if e.is::<WriteTimeout>() => "timeout",
        Err(kube::Error::Service(e)) if e.is::<super::leader::NotLeader>() => "not_leader",
        Err(_) => "error",
    }
}

/// The error of a write abandoned after the write timeout.
#[derive(Debug, thiserror::Error)]
#[error(
    "the API server did not answer within {}ms: the write was abandoned (it must end within the leader fence's margin)",
    .after.as_millis()
)]
pub struct WriteTimeout {
    /// The timeout.
    pub after: Duration,
}

/// Run one API write, abandoning it (dropping the request) after `timeout` when there is one.
pub(crate) async fn bounded<T>(
    timeout: Option<Duration>,
    write: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match timeout {
        None => write.await,
        Some(after) => match tokio::time::timeout(after, write).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service(Box::new(WriteTimeout { after }))),
        },
    }
}

/// Whether an error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether an error says the API server does not serve the kind at all (its CRD is not
/// installed): kube-apiserver answers a path of an unknown group with a plain-text
/// `404 page not found` (no Status), and an unknown resource of a known group with a NotFound
/// Status whose message names no object.
pub fn is_not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404
        && (s.reason != "NotFound" || s.message == "the server could not find the requested resource"))
}

/// Whether an error is a 409.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Whether an error is a 409 AlreadyExists (a create whose name is taken).
pub fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

/// The API server's message of a refused write (or the error's text).
pub fn message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

fn uid_precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// The writer.
#[derive(Clone)]
pub struct Writer {
    client: Client,
    metrics: std::sync::Arc<WriteMetrics>,
    leader: super::leader::Leadership,
    /// The last status write of each object (see [`status::Written`]).
    written: std::sync::Arc<status::Written>,
    /// Pods are created in protobuf until the server refuses it.
    protobuf: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").finish_non_exhaustive()
    }
}

impl Writer {
    /// A writer counting into `metrics`, writing only while `leader` says so.
    pub fn new(
        client: Client,
        metrics: std::sync::Arc<WriteMetrics>,
        leader: super::leader::Leadership,
    ) -> Self {
        Writer {
            client,
            metrics,
            leader,
            written: Default::default(),
            protobuf: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Refuse the write unless this process leads (counted as `<verb>/not_leader`).
    fn fence(&self, verb: &str) -> Result<(), kube::Error> {
        self.leader.fence().map_err(|e| {
            self.metrics.record(verb, "not_leader");
            kube::Error::Service(Box::new(e))
        })
    }

    /// Make one write: abandoned after the write timeout, counted under `verb`.
    async fn write<T>(
        &self,
        verb: &str,
        write: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        // Counted in flight before the fence is checked: once it is closed, only writes counted
        // then can still land.
        self.metrics.enter();
        let r = match self.fence(verb) {
            Ok(()) => {
                let r = bounded(self.leader.write_timeout(), write).await;
                self.metrics.record(verb, outcome(&r));
                r
            }
            Err(e) => Err(e),
        };
        self.metrics.leave();
        r
    }

    /// The counters.
    pub fn metrics(&self) -> &WriteMetrics {
        &self.metrics
    }

    /// Server-side apply a child (JSON with `apiVersion`, `kind`, `metadata.name` and
    /// `metadata.namespace`) with the host's field manager; returns the stored object. Over an
    /// existing object (one the caller checked is the parent's), `resource_version` is the
    /// version checked: the apply is forced (a user's edit of a host-owned field is taken back)
    /// but fails with a 409 if the object changed since, so it never takes over one that was
    /// replaced meanwhile. A host Update entry left in managedFields (by the child's create) is
    /// dropped after the apply.
    ///
    /// # Errors
    /// The API error.
    pub async fn apply_child(
        &self,
        kind: ChildKind,
        object: &Value,
        resource_version: Option<String>,
    ) -> Result<Value, kube::Error> {
        self.fence("apply")?;
        let mut object = object.clone();
        let field = |v: &Value, p: &str| {
            v.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let (ns, name) = (
            field(&object, "/metadata/namespace"),
            field(&object, "/metadata/name"),
        );
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &kind.api_resource());
        let mut pp = PatchParams::apply(FIELD_MANAGER);
        if let Some(rv) = resource_version {
            pp = pp.force();
            object["metadata"]["resourceVersion"] = rv.into();
        }
        let r = self
            .write("apply", api.patch(&name, &pp, &Patch::Apply(&object)))
            .await;
        let stored = serde_json::to_value(r?).map_err(kube::Error::SerdeError)?;
        // A create (or an older host) left an Update entry of the host's: drop it now, before a
        // later apply leaves a field out (a field the Update entry still owns would stay, and
        // then belong to no one). Another writer changing the object meanwhile (a StatefulSet's
        // status right after its create) is a 409: read it again and retry. Best effort past
        // that: the object is as built, and the next apply tries again.
        // The apply's answer is returned either way: it is what the API server made of the build
        // (the caller compares it with the build to find fields the server dropped); the object
        // re-read for a retry may carry another writer's change since.
        let mut current = stored.clone();
        for _ in 0..5 {
            match self.drop_update_entry(&api, &name, &current).await {
                Ok(_) => return Ok(stored),
                Err(e) if is_conflict(&e) => match api.get(&name).await {
                    Ok(o) => current = serde_json::to_value(o).map_err(kube::Error::SerdeError)?,
                    Err(e) => {
                        tracing::warn!(%kind, %ns, %name, "re-reading to drop the host's Update entry: {}", message(&e));
                        return Ok(stored);
                    }
                },
                Err(e) => {
                    tracing::warn!(%kind, %ns, %name, "dropping the host's Update entry from managedFields: {}", message(&e));
                    return Ok(stored);
                }
            }
        }
        tracing::warn!(%kind, %ns, %name, "the host's Update entry stays in managedFields: the object kept changing");
        Ok(stored)
    }

    /// Create a child that does not exist: a 409 AlreadyExists when its name is taken, so nothing
    /// is merged into another's object. The caller then applies it over the created version
    /// ([`Writer::apply_child`]), which hands its fields to the host's Apply entry.
    ///
    /// # Errors
    /// The API error (409 AlreadyExists included).
    pub async fn create_child(&self, kind: ChildKind, object: &Value) -> Result<Value, kube::Error> {
        self.fence("create_child")?;
        let ns = object
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &kind.api_resource());
        let body: DynamicObject = serde_json::from_value(object.clone()).map_err(kube::Error::SerdeError)?;
        let pp = post_params();
        let r = self.write("create_child", api.create(&pp, &body)).await;
        serde_json::to_value(r?).map_err(kube::Error::SerdeError)
    }

    /// Patch `stored`'s managedFields without the host's Update entry of the object (not of its
    /// status), with a resourceVersion precondition; `None` when it has none.
    async fn drop_update_entry(
        &self,
        api: &Api<DynamicObject>,
        name: &str,
        stored: &Value,
    ) -> Result<Option<Value>, kube::Error> {
        let entries = stored
            .pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let ours = |e: &Value| {
            e.get("manager").and_then(Value::as_str) == Some(FIELD_MANAGER)
                && e.get("operation").and_then(Value::as_str) == Some("Update")
                && e.get("subresource")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .is_empty()
        };
        if !entries.iter().any(ours) {
            return Ok(None);
        }
        let mut kept: Vec<Value> = entries.into_iter().filter(|e| !ours(e)).collect();
        if kept.is_empty() {
            // One empty entry clears managedFields.
            kept.push(json!({}));
        }
        self.fence("patch")?;
        let patch = json!({"metadata": {"resourceVersion": stored.pointer("/metadata/resourceVersion"),
            "managedFields": kept}});
        let pp = patch_params();
        let r = self
            .write("patch", api.patch(name, &pp, &Patch::Merge(&patch)))
            .await;
        Ok(Some(serde_json::to_value(r?).map_err(kube::Error::SerdeError)?))
    }

    /// Merge-patch a child (`patch` carries the resourceVersion it was computed from, when it
    /// must); returns the stored object.
    ///
    /// # Errors
    /// The API error.
    pub async fn patch_child(
        &self,
        kind: ChildKind,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, kube::Error> {
        self.fence("patch")?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &kind.api_resource());
        let pp = patch_params();
        let r = self
            .write("patch", api.patch(name, &pp, &Patch::Merge(patch)))
            .await;
        serde_json::to_value(r?).map_err(kube::Error::SerdeError)
    }

    /// Delete a child, only if it still has `uid`: `true` when deleted now, `false` when it was
    /// already gone.
    ///
    /// # Errors
    /// The API error.
    pub async fn delete_child(
        &self,
        kind: ChildKind,
        ns: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error> {
        self.fence("delete")?;
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), ns, &kind.api_resource());
        let r = self
            .write("delete", api.delete(name, &uid_precondition(uid)))
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }
}

/// Parameters of a create by the host (its field manager).
fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Parameters of a patch by the host (its field manager).
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}
