//! The one path every child other than a pod takes, whatever its kind or parent: the
//! Controller's Services, ConfigMap and StatefulSet, a NodeSet's ConfigMap, and the workers'
//! Service and PodDisruptionBudget shared by a Controller's NodeSets.
//!
//! # Guarantees
//! * **Ownership before force**: a child is applied only over an object its parent owns (a
//!   controller owner reference with the parent's UID; for a shared child, an owner reference to
//!   one of the NodeSets sharing it and no controller) or created when none exists (the check
//!   reads the API when the cache has none). An object of that name the host did not build is
//!   never taken over: `ChildFailure`, reason `NotOwned`, and an Event, until it is deleted.
//! * **A steady state makes no writes**: a child is applied when the live object lacks something
//!   the builder wants or the builder's output changed (the `slinky.slurm.net/applied-hash`
//!   annotation), never because another manager added fields. The resourceVersion each apply
//!   left is remembered with the hash it applied: an object no one changed since is not compared
//!   again, so fields an older API server drops (a native sidecar's `restartPolicy`) cost one
//!   apply, not one per resync.
//! * **Server-side apply** with the host's field manager, forced over the version whose ownership
//!   was checked (a 409 if it changed since: re-read from the API and tried again). A child that
//!   does not exist is **created** (a create, not an apply: an object someone made in between is
//!   a 409 AlreadyExists, re-read and put through the ownership check, never merged into), then
//!   applied so the host owns its fields as an applier. Several NodeSets creating their shared
//!   Service at once: one creates it, the others find it theirs (shared) and apply.
//! * **Pruning** deletes only objects of the child kinds that the parent controls *and* that
//!   carry the builder annotation, with a UID precondition.
//! * A refused write is an Event (`FailedApply`, `FailedDelete`) and a failure the caller turns
//!   into the `ChildFailure` condition and a backoff.

mod immutables;
mod ownership;

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{Api, api::DynamicObject, runtime::events::EventType};
use serde_json::Value;
use sha2::{Digest, Sha256};
use slinky_api::{failure::Failure, keys};

pub(crate) use immutables::{statefulset_recreate, with_live_immutables};
pub use ownership::owned_by;
use ownership::{holder, owners};

use super::{
    Error,
    applied::{AppliedVersions, ChildKey},
    caches::ChildCaches,
    compare::{contains, differences, dropped_note},
    context::Core,
    writer,
};
use crate::plugins::{Child, ChildKind, Ownership};

/// The hash of a child as its builder wants it (owner references included).
pub fn applied_hash(object: &Value) -> String {
    let text = serde_json::to_string(object).unwrap_or_default();
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

fn field<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// `object` without the applied-hash annotation.
fn unhashed(object: &Value) -> Value {
    let mut o = object.clone();
    if let Some(a) = o
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    {
        a.remove(keys::ANNOTATION_APPLIED_HASH);
    }
    o
}

/// The builder annotations a host before output revisions put on a workload's pod template:
/// applied again as they are, so the upgrade does not change the template (and restart
/// slurmctld, slurmdbd, slurmrestd or the login pods) for provenance. They stay, even after a
/// later template change (whether the rest of a live template is what the builder builds cannot
/// be told for sure: an API server drops fields it does not serve, and a restart over it would be
/// the costly mistake); the workload's own annotations name today's builder.
fn keep_template_provenance(live: &Value, desired: &mut Value) {
    const TEMPLATE_ANNOTATIONS: &str = "/spec/template/metadata/annotations";
    let Some(live_annotations) = live.pointer(TEMPLATE_ANNOTATIONS).and_then(Value::as_object) else {
        return;
    };
    let kept: serde_json::Map<String, Value> = [keys::ANNOTATION_BUILDER, keys::ANNOTATION_BUILDER_DIGEST]
        .iter()
        .filter_map(|k| live_annotations.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    if kept.is_empty() {
        return;
    }
    let Some(template) = desired
        .pointer_mut("/spec/template")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let meta = template
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(meta) = meta.as_object_mut() {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(a) = annotations.as_object_mut() {
            a.extend(kept);
        }
    }
}

/// A child as its builder wants it, through the attempts of one [`ChildSync::ensure`].
struct Wanted {
    key: ChildKey,
    ownership: Ownership,
    /// The hash of the built object (its applied-hash annotation).
    hash: String,
    /// What is applied: the built object with its hash (a StatefulSet whose immutable fields
    /// differ: with the live ones).
    object: Value,
    /// The child, for messages.
    what: String,
    /// Only part of it is applied (an immutable field differs): never remembered as applied.
    partial: bool,
}

impl Wanted {
    fn of(child: &Child) -> Self {
        let mut object = child.object.clone();
        let hash = applied_hash(&object);
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            let annotations = meta
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(keys::ANNOTATION_APPLIED_HASH.into(), hash.clone().into());
            }
        }
        Wanted {
            key: (
                child.kind,
                child.namespace().to_string(),
                child.name().to_string(),
            ),
            ownership: child.ownership,
            hash,
            object,
            what: child.describe(),
            partial: false,
        }
    }
}

/// What an attempt of [`ChildSync::ensure`] leaves to do after reading the live object (or
/// creating a missing one).
enum Step {
    /// Nothing: whether the child is as built.
    Done(bool),
    /// Read the live object from the API again, and start over.
    ReadAgain,
    /// Apply over this resourceVersion (of the live or the just created object).
    ApplyOver(String),
}

/// One parent's pass over its children: what failed, for the caller's `ChildFailure` condition.
pub struct ChildSync<'a, P: kube::Resource<DynamicType = ()>> {
    core: &'a Core,
    /// The child caches (the live objects, the objects to prune).
    caches: &'a ChildCaches,
    /// What the host last applied to each child.
    applied: &'a AppliedVersions,
    parent: &'a P,
    /// The parent's conditions when the pass began (an ownership problem's Event is sent once).
    current: &'a [Condition],
    /// For shared children: the UIDs of the NodeSets sharing them.
    sharers: BTreeSet<String>,
    /// Each refused write and ownership problem (`ChildFailure`).
    pub failures: Vec<Failure>,
    /// The messages of this pass's once-only problems (announced by one Event each).
    standing: BTreeSet<String>,
    /// The child the pass is at (the `related` object of its Events).
    about: Option<k8s_openapi::api::core::v1::ObjectReference>,
}

/// A reference to a child, for Events.
fn child_ref(kind: ChildKind, ns: &str, name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    let ar = kind.api_resource();
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(ar.api_version),
        kind: Some(ar.kind),
        namespace: Some(ns.to_string()),
        name: Some(name.to_string()),
        ..Default::default()
    }
}

impl<'a, P: kube::Resource<DynamicType = ()>> ChildSync<'a, P> {
    /// A pass over `parent`'s children, whose conditions are `current`; `sharers` are the UIDs
    /// of the NodeSets that share its shared children.
    pub fn new(
        core: &'a Core,
        caches: &'a ChildCaches,
        applied: &'a AppliedVersions,
        parent: &'a P,
        current: &'a [Condition],
        sharers: BTreeSet<String>,
    ) -> Self {
        ChildSync {
            core,
            caches,
            applied,
            parent,
            current,
            sharers,
            failures: Vec::new(),
            standing: BTreeSet::new(),
            about: None,
        }
    }

    /// The pass is over: its failures, for the parent's condition. Once-only problems that no
    /// longer stand are forgotten, so one that recurs is announced again.
    pub fn finish(&mut self) -> Vec<Failure> {
        self.core
            .announced
            .keep_only(&self.parent_uid(), std::mem::take(&mut self.standing));
        std::mem::take(&mut self.failures)
    }

    /// A refused write (an Event each time) or an ownership problem (an Event once while it
    /// stands: not again on later passes, whether or not the condition names it).
    async fn failed(&mut self, reason: &'static str, message: String, once: bool) {
        let failure = Failure::child(reason, message);
        let announced = once && {
            self.standing.insert(failure.message.clone());
            !self.core.announced.first(&self.parent_uid(), &failure.message)
        };
        if !announced {
            let current = if once { self.current } else { &[] };
            self.core
                .report_about(self.parent, self.about.clone(), current, &failure)
                .await;
        }
        self.failures.push(failure);
    }

    /// A write of a child the host makes itself (not a builder's: a LoginSet's host keys) was
    /// refused: an Event each time, and a failure for the parent's `ChildFailure` condition.
    pub async fn refused(&mut self, reason: &'static str, kind: ChildKind, name: &str, message: String) {
        let ns = self.parent.meta().namespace.clone().unwrap_or_default();
        self.about = Some(child_ref(kind, &ns, name));
        self.failed(reason, message, false).await;
    }

    /// An ownership problem of a child the host makes itself: an Event once while it stands,
    /// and a failure for the parent's `ChildFailure` condition.
    pub async fn refused_once(&mut self, reason: &'static str, kind: ChildKind, name: &str, message: String) {
        let ns = self.parent.meta().namespace.clone().unwrap_or_default();
        self.about = Some(child_ref(kind, &ns, name));
        self.failed(reason, message, true).await;
    }

    fn parent_uid(&self) -> String {
        self.parent.meta().uid.clone().unwrap_or_default()
    }

    /// The live object: from the cache, or (when the cache has none, or `fresh`) from the API.
    async fn live(&self, kind: ChildKind, ns: &str, name: &str, fresh: bool) -> Result<Option<Value>, Error> {
        if !fresh && let Some(v) = self.caches.get(kind, ns, name) {
            return Ok(Some(v));
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.core.client.clone(), ns, &kind.api_resource());
        Ok(api.get_opt(name).await?.map(|mut o| {
            o.metadata.managed_fields = None;
            serde_json::to_value(o).unwrap_or(Value::Null)
        }))
    }

    /// Apply `child` unless the live object already has it; `true` when it is as built
    /// afterwards.
    ///
    /// # Errors
    /// API errors reading the live object (a refused write is a failure, not an error).
    pub async fn ensure(&mut self, child: &Child) -> Result<bool, Error> {
        let mut want = Wanted::of(child);
        let (kind, ns, name) = want.key.clone();
        self.about = Some(child_ref(kind, &ns, &name));
        let mut fresh = false;
        for attempt in 0..3 {
            let live = match self.live(kind, &ns, &name, fresh).await {
                Err(Error::Kube(e)) if writer::is_not_served(&e) => {
                    let what = want.what.clone();
                    self.not_served(kind, &what).await;
                    return Ok(false);
                }
                live => live?,
            };
            let step = match &live {
                Some(l) => self.over_live(&mut want, l).await,
                None => self.create(&want, attempt).await,
            };
            let as_built = match step {
                Step::Done(as_built) => Some(as_built),
                Step::ReadAgain => None,
                Step::ApplyOver(rv) => self.apply(&want, rv, attempt).await,
            };
            match as_built {
                Some(as_built) => return Ok(as_built),
                None => fresh = true,
            }
        }
        Ok(false)
    }

    /// What the live object leaves to do: nothing when it is not the parent's (refused) or is
    /// as built, else an apply over its resourceVersion. A StatefulSet whose immutable fields
    /// differ is deleted to be recreated (opt-in), or keeps them: the rest is applied, reported.
    async fn over_live(&mut self, want: &mut Wanted, live: &Value) -> Step {
        let what = &want.what;
        if !owned_by(live, want.ownership, &self.parent_uid(), &self.sharers) {
            let msg = format!(
                "{what} exists and is not this {}'s ({}): it is left alone; delete it to let \
                 the host build it",
                P::kind(&()),
                holder(live)
            );
            self.failed("NotOwned", msg, true).await;
            return Step::Done(false);
        }
        let rv = field(live, "/metadata/resourceVersion")
            .unwrap_or_default()
            .to_string();
        let (key, hash, desired) = (&want.key, want.hash.as_str(), &want.object);
        let up_to_date = self.applied.matches(key, hash, &rv)
            || (field(live, "/metadata/annotations/slinky.slurm.net~1applied-hash") == Some(hash)
                && (contains(live, desired)
                    || self
                        .applied
                        .only_dropped(key, hash, &differences(live, desired, 10))));
        if up_to_date {
            return Step::Done(true);
        }
        if key.0 == ChildKind::StatefulSet
            && let Some(immutable) = statefulset_recreate(live, desired)
        {
            if self.core.recreate_statefulsets {
                self.recreate(key, what, live, &immutable).await;
                return Step::Done(false);
            }
            let msg = format!(
                "{what} has another {immutable} than its builder builds, and a \
                 StatefulSet cannot change it in place: it is kept as it is (the rest \
                 of the template is still applied), slurmctld keeps its state. Change the \
                 Controller back, or run the host with --recreate-statefulsets to delete \
                 and recreate it (its claims are retained)"
            );
            self.failed("ImmutableFieldChanged", msg, true).await;
            // Apply what can change; not remembered as applied, so the next pass
            // reports the difference again.
            want.partial = true;
            want.object = with_live_immutables(live, &want.object);
            if contains(live, &want.object) {
                return Step::Done(false);
            }
        }
        keep_template_provenance(live, &mut want.object);
        Step::ApplyOver(rv)
    }

    /// None exists: create it (without the applied hash, so a pass that finds it before the
    /// apply succeeded applies it), to apply over what was created.
    async fn create(&mut self, want: &Wanted, attempt: u32) -> Step {
        let what = &want.what;
        match self
            .core
            .writer
            .create_child(want.key.0, &unhashed(&want.object))
            .await
        {
            Ok(created) => Step::ApplyOver(
                field(&created, "/metadata/resourceVersion")
                    .unwrap_or_default()
                    .to_string(),
            ),
            // Created by someone else since it was read: read the API again, and the
            // ownership check decides (never merged into).
            Err(e) if writer::is_already_exists(&e) && attempt < 2 => {
                tracing::debug!(child = %what, "create found the name taken; re-reading");
                Step::ReadAgain
            }
            Err(e) if writer::is_not_served(&e) => {
                self.not_served(want.key.0, what).await;
                Step::Done(false)
            }
            Err(e) => {
                let msg = format!("Error creating {what}: {}", writer::message(&e));
                self.failed("FailedCreate", msg, false).await;
                Step::Done(false)
            }
        }
    }

    /// The API server does not serve `kind` (its CRD is not installed): a failure naming the
    /// CRD and the way out, its Event once while it stands.
    async fn not_served(&mut self, kind: ChildKind, what: &str) {
        let msg = format!(
            "Error creating {what}: the API server does not serve {} {} (its CRD is not installed){}",
            kind.api_version(),
            kind.kind(),
            if kind == ChildKind::ServiceMonitor {
                ": install the Prometheus Operator's CRDs, or set spec.metrics.serviceMonitor.enabled \
                 to false"
            } else {
                ""
            }
        );
        self.failed("FailedCreate", msg, true).await;
    }

    /// Apply over `resource_version`: whether the child is as built afterwards, or `None` when
    /// the object changed since it was read (read it again).
    async fn apply(&mut self, want: &Wanted, resource_version: String, attempt: u32) -> Option<bool> {
        let what = &want.what;
        match self
            .core
            .writer
            .apply_child(want.key.0, &want.object, Some(resource_version))
            .await
        {
            Ok(stored) => Some(self.stored(want, &stored).await),
            // Changed since it was read (another reconcile applied it): read the API again.
            Err(e) if writer::is_conflict(&e) && attempt < 2 => {
                tracing::debug!(child = %what, "apply conflicted; re-reading");
                None
            }
            Err(e) => {
                let msg = format!("Error applying {what}: {}", writer::message(&e));
                self.failed("FailedApply", msg, false).await;
                Some(false)
            }
        }
    }

    /// What an apply stored: remembered with the fields the API server dropped (an Event names
    /// them), unless only part was applied; whether the child is as built.
    async fn stored(&mut self, want: &Wanted, stored: &Value) -> bool {
        let rv = field(stored, "/metadata/resourceVersion")
            .unwrap_or_default()
            .to_string();
        let paths = differences(stored, &want.object, 10);
        if want.partial {
            return false;
        }
        self.applied
            .set(want.key.clone(), want.hash.clone(), rv, paths.clone());
        if !paths.is_empty() {
            let note = dropped_note(&want.what, &paths);
            tracing::warn!("{note}");
            self.core
                .event_about(
                    self.parent,
                    self.about.clone(),
                    EventType::Warning,
                    "FieldsDropped",
                    note,
                )
                .await;
        }
        true
    }

    /// Delete a StatefulSet whose immutable fields changed (with a UID precondition); the next
    /// pass creates it anew.
    async fn recreate(&mut self, key: &ChildKey, what: &str, live: &Value, immutable: &str) {
        let uid = field(live, "/metadata/uid").unwrap_or_default();
        // Its claims must outlive it: a StatefulSet made by an older host or by Slinky may delete
        // them with it. Retain/Retain first (a 409 if it changed since: the next pass again).
        let retain = |p: &str| {
            field(live, &format!("/spec/persistentVolumeClaimRetentionPolicy/{p}")) == Some("Retain")
        };
        if !(retain("whenDeleted") && retain("whenScaled")) {
            let patch = serde_json::json!({"metadata": {"resourceVersion": field(live, "/metadata/resourceVersion")},
                "spec": {"persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"}}});
            if let Err(e) = self.core.writer.patch_child(key.0, &key.1, &key.2, &patch).await {
                let msg = format!(
                    "Error retaining the claims of {what} before recreating it: {} (it is not deleted)",
                    writer::message(&e)
                );
                self.failed("FailedApply", msg, false).await;
                return;
            }
            // Deleted by the next pass, from the object with the retention it now has.
            return;
        }
        match self.core.writer.delete_child(key.0, &key.1, &key.2, uid).await {
            Ok(_) => {
                self.applied.forget(key);
                self.core
                    .event_about(
                        self.parent,
                        self.about.clone(),
                        EventType::Normal,
                        "Recreating",
                        format!(
                            "Deleted {what} to create it again: {immutable} changed, and it cannot be updated"
                        ),
                    )
                    .await;
            }
            Err(e) => {
                let msg = format!("Error deleting {what} (to recreate it): {}", writer::message(&e));
                self.failed("FailedDelete", msg, false).await;
            }
        }
    }
}

mod prune;
pub use prune::keys_of;

#[cfg(test)]
mod tests;
