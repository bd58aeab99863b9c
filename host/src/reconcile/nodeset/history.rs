//! A NodeSet's revision history: one `apps/v1` ControllerRevision per pod revision it rolled to,
//! as a StatefulSet keeps (Kubernetes' `controller_history.go`, Slinky's `nodeset_history.go`).
//!
//! * A revision is named `<nodeset>-<hash>` after the pods' `controller-revision-hash`, labelled
//!   with the NodeSet's selector labels plus that label, and controlled by the NodeSet. It is
//!   found by the same selector labels it carries (Slinky labels its revisions with the
//!   template's labels but lists them by the selector labels, so its rollback and truncation
//!   never see them; and it compares revision names with pod hashes, so no pod keeps its
//!   revision alive).
//! * Numbers: a new revision gets the highest number plus one. A spec whose pods hash to an
//!   older revision again (a rollback) gives that revision the next number instead of a copy.
//! * `data` is `{"spec": {…}}` with the spec fields the pods are made of
//!   ([`crate::revision::revision_data`]): a JSON merge patch that rolls the NodeSet back.
//! * After the pass's pod writes, the revisions beyond `spec.revisionHistoryLimit` (default 0)
//!   are deleted, lowest number first, never the update revision nor one a pod of the NodeSet
//!   (terminating ones included) still runs.
//! * Orphans carrying the NodeSet's selector labels are adopted, after a fresh read shows the
//!   NodeSet live (as Slinky's `adoptOrphanRevisions`).
//!
//! # Guarantees
//! * Revisions are read from the cache (labels and numbers, not their `data`): a steady state
//!   makes no request and no write.
//! * A refused write is an Event and a `ChildFailure` condition (the pass backs off); a 409 from
//!   a cache behind the host's own writes only brings the next pass sooner. Neither stops the
//!   pods from rolling: the history records them, it does not drive them.
//! * A revision name held by another object is `ChildFailure` (`NotOwned`) and one Event until it
//!   is gone (a previous NodeSet's, garbage collected soon). No `collisionCount` renames around
//!   it: the name is the pods' hash, so a rename would roll every pod.
//! * Writes carry preconditions: a number or owner change the resourceVersion it was computed
//!   from, a delete the UID.

use std::{collections::BTreeSet, sync::Arc};

use k8s_openapi::{
    api::{
        apps::v1::ControllerRevision,
        core::v1::{ObjectReference, Pod},
    },
    apimachinery::pkg::runtime::RawExtension,
};
use kube::{Api, ResourceExt, api::ObjectMeta, runtime::reflector::Store};
use serde_json::{Value, json};
use slinky_api::{NodeSet, failure::Failure, keys, owners::controller_ref};

use super::Pass;
use crate::{
    reconcile::core::writer,
    revision::{revision_data, revision_name},
};

/// The UID of an object's controller, if it has one.
fn controller_uid(r: &ControllerRevision) -> Option<&str> {
    r.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// A revision's number (0 when the API left it out).
fn number(r: &ControllerRevision) -> i64 {
    r.revision.unwrap_or(0)
}

/// Whether `r` carries the NodeSet's selector labels and the hash label of its name.
fn labelled(ns: &NodeSet, r: &ControllerRevision, hash: &str) -> bool {
    let labels = r.labels();
    ns.selector_labels().iter().all(|(k, v)| labels.get(k) == Some(v))
        && labels.get(keys::LABEL_REVISION_HASH).map(String::as_str) == Some(hash)
}

/// The NodeSet's revisions in the cache: in its namespace, with its selector labels, controlled
/// by it or by nothing (orphans); in Kubernetes' order (number, then creation, then name).
pub(super) fn history_of(ns: &NodeSet, store: &Store<ControllerRevision>) -> Vec<Arc<ControllerRevision>> {
    let (namespace, uid) = (ns.namespace(), ns.uid().unwrap_or_default());
    let selector = ns.selector_labels();
    let mut history: Vec<Arc<ControllerRevision>> = store
        .state()
        .into_iter()
        .filter(|r| r.namespace() == namespace)
        .filter(|r| selector.iter().all(|(k, v)| r.labels().get(k) == Some(v)))
        .filter(|r| controller_uid(r).is_none_or(|c| c == uid))
        .collect();
    sort(&mut history);
    history
}

fn sort(history: &mut [Arc<ControllerRevision>]) {
    history.sort_by_key(|r| {
        (
            number(r),
            r.metadata.creation_timestamp.as_ref().map(|t| t.0),
            r.name_any(),
        )
    });
}

/// What becomes of the update revision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Update {
    /// It is the latest revision: nothing to do.
    Current,
    /// It does not exist: create it with this number.
    Create(i64),
    /// It exists at position `.0` of the history but is not the latest (a rollback): give it
    /// number `.1`.
    Bump(usize, i64),
}

/// What becomes of the revision named `name`, given the history (sorted).
pub(super) fn plan_update(name: &str, history: &[Arc<ControllerRevision>]) -> Update {
    let next = history.last().map_or(1, |r| number(r) + 1);
    match history.iter().position(|r| r.name_any() == name) {
        None => Update::Create(next),
        Some(i) if i + 1 == history.len() => Update::Current,
        Some(i) => Update::Bump(i, next),
    }
}

/// The revisions to delete: those not `live`, lowest number first, beyond the `limit` kept.
pub(super) fn plan_truncate(
    history: &[Arc<ControllerRevision>],
    live: &BTreeSet<String>,
    limit: usize,
) -> Vec<Arc<ControllerRevision>> {
    let old: Vec<&Arc<ControllerRevision>> =
        history.iter().filter(|r| !live.contains(&r.name_any())).collect();
    let excess = old.len().saturating_sub(limit);
    old.into_iter().take(excess).cloned().collect()
}

/// The revision names a live NodeSet keeps: the update revision's and those of its pods.
pub(super) fn live_revisions(ns: &NodeSet, hash: &str, pods: &[Arc<Pod>]) -> BTreeSet<String> {
    pods.iter()
        .filter_map(|p| p.labels().get(keys::LABEL_REVISION_HASH))
        .map(|h| revision_name(ns, h))
        .chain([revision_name(ns, hash)])
        .collect()
}

/// The revision the NodeSet's pods of `hash` are made from, as created.
fn new_revision(ns: &NodeSet, hash: &str, number: i64) -> Result<ControllerRevision, String> {
    let data = revision_data(ns).map_err(|e| e.to_string())?;
    let mut labels = ns.selector_labels();
    labels.insert(keys::LABEL_REVISION_HASH.into(), hash.into());
    Ok(ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(ns, hash)),
            namespace: ns.namespace(),
            labels: Some(labels),
            owner_references: controller_ref(ns).map(|o| vec![o]),
            ..Default::default()
        },
        data: RawExtension(data),
        revision: Some(number),
    })
}

fn reference(r: &ControllerRevision) -> ObjectReference {
    ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("ControllerRevision".into()),
        name: Some(r.name_any()),
        namespace: r.namespace(),
        uid: r.uid(),
        ..Default::default()
    }
}

/// A refused history write (an Event each time) or a held name (`once`: an Event while the
/// condition does not say it yet); either is a `ChildFailure`.
async fn failed(
    pass: &mut Pass<'_>,
    about: &ControllerRevision,
    reason: &'static str,
    message: String,
    once: bool,
) {
    let failure = Failure::child(reason, message);
    let current = if once { pass.state.current() } else { &[] };
    pass.core()
        .report_about(pass.ns, Some(reference(about)), current, &failure)
        .await;
    pass.child_failures.push(failure);
}

/// Whether a fresh read shows the NodeSet as the one this pass reconciles, not being deleted
/// (only a live owner adopts). A failed read is a failure of the pass.
async fn may_adopt(pass: &mut Pass<'_>, about: &ControllerRevision) -> bool {
    let ns = pass.ns;
    let api: Api<NodeSet> = Api::namespaced(pass.core().client.clone(), &ns.namespace().unwrap_or_default());
    match api.get(&ns.name_any()).await {
        Ok(fresh) => {
            fresh.uid().as_deref() == Some(pass.uid.as_str()) && fresh.metadata.deletion_timestamp.is_none()
        }
        Err(e) => {
            let msg = format!(
                "Error reading NodeSet {} to adopt ControllerRevision {}: {}",
                ns.name_any(),
                about.name_any(),
                writer::message(&e)
            );
            failed(pass, about, "FailedAdopt", msg, false).await;
            false
        }
    }
}

/// The merge patch that makes `r` the NodeSet's: its controller reference added to the owners it
/// has, and, when `hash` is given, the labels that find it.
fn adoption_patch(ns: &NodeSet, r: &ControllerRevision, hash: Option<&str>) -> Value {
    let mut refs = r.owner_references().to_vec();
    refs.extend(controller_ref(ns));
    let mut patch = json!({"metadata": {"ownerReferences": refs}});
    if let Some(hash) = hash {
        let mut labels = ns.selector_labels();
        labels.insert(keys::LABEL_REVISION_HASH.into(), hash.into());
        patch["metadata"]["labels"] = json!(labels);
    }
    patch
}

/// Adopt `r`, an orphan: the adopted revision, or `None` (refused, reported).
async fn adopt(
    pass: &mut Pass<'_>,
    r: &ControllerRevision,
    hash: Option<&str>,
) -> Option<ControllerRevision> {
    let patch = adoption_patch(pass.ns, r, hash);
    match pass.core().writer.patch_revision(r, patch).await {
        Ok(adopted) => {
            tracing::info!(revision = %r.name_any(), "adopted an orphan ControllerRevision");
            Some(adopted)
        }
        Err(e) if writer::is_conflict(&e) => {
            pass.retry_soon();
            None
        }
        Err(e) => {
            let msg = format!(
                "Error adopting ControllerRevision {}: {}",
                r.name_any(),
                writer::message(&e)
            );
            failed(pass, r, "FailedAdopt", msg, false).await;
            None
        }
    }
}

/// Record the update revision, `hash`, in the NodeSet's history: adopt the orphans, then create
/// the revision, or give it the next number when it is an older one (a rollback). Returns the
/// history the NodeSet controls, for [`truncate`].
pub(super) async fn record(pass: &mut Pass<'_>, hash: &str) -> Vec<Arc<ControllerRevision>> {
    let ns = pass.ns;
    let mut history = history_of(ns, &pass.ctx.caches.revisions);
    let orphans: Vec<usize> = (0..history.len())
        .filter(|i| controller_uid(&history[*i]).is_none())
        .collect();
    if let Some(first) = orphans.first().map(|i| history[*i].clone())
        && may_adopt(pass, &first).await
    {
        for &i in &orphans {
            if let Some(adopted) = adopt(pass, &history[i].clone(), None).await {
                history[i] = Arc::new(adopted);
            }
        }
    }
    history.retain(|r| controller_uid(r) == Some(pass.uid.as_str()));
    let name = revision_name(ns, hash);
    match plan_update(&name, &history) {
        Update::Current => {}
        Update::Bump(i, to) => {
            let r = history[i].clone();
            match pass
                .core()
                .writer
                .patch_revision(&r, json!({ "revision": to }))
                .await
            {
                Ok(bumped) => {
                    tracing::info!(revision = %name, from = number(&r), to, "rolled back to an earlier revision");
                    history[i] = Arc::new(bumped);
                    sort(&mut history);
                }
                Err(e) if writer::is_conflict(&e) || writer::is_not_found(&e) => pass.retry_soon(),
                Err(e) => {
                    let msg = format!(
                        "Error numbering ControllerRevision {name} {to} (it was {}; the NodeSet rolls back to it): {}",
                        number(&r),
                        writer::message(&e)
                    );
                    failed(pass, &r, "FailedUpdate", msg, false).await;
                }
            }
        }
        Update::Create(number) => create(pass, hash, number).await,
    }
    history
}

/// Create the revision of `hash`; a name already taken is read from the API: the NodeSet's own
/// (the cache lags, or it lost its labels: they are put back), an orphan (adopted) or another's
/// (reported).
async fn create(pass: &mut Pass<'_>, hash: &str, number: i64) {
    let ns = pass.ns;
    let rev = match new_revision(ns, hash, number) {
        Ok(rev) => rev,
        Err(e) => {
            let about = ControllerRevision {
                metadata: ObjectMeta {
                    name: Some(revision_name(ns, hash)),
                    namespace: ns.namespace(),
                    ..Default::default()
                },
                ..Default::default()
            };
            failed(
                pass,
                &about,
                "FailedCreate",
                format!("Error building ControllerRevision {}: {e}", about.name_any()),
                false,
            )
            .await;
            return;
        }
    };
    let name = rev.name_any();
    let e = match pass.core().writer.create_revision(&rev).await {
        Ok(_) => {
            tracing::info!(revision = %name, number, "recorded a new revision");
            return;
        }
        Err(e) => e,
    };
    if !writer::is_already_exists(&e) {
        let msg = format!(
            "Error creating ControllerRevision {name}: {}",
            writer::message(&e)
        );
        failed(pass, &rev, "FailedCreate", msg, false).await;
        return;
    }
    let api: Api<ControllerRevision> =
        Api::namespaced(pass.core().client.clone(), &ns.namespace().unwrap_or_default());
    let live = match api.get_opt(&name).await {
        Ok(Some(live)) => live,
        // Deleted meanwhile: the next pass creates it.
        Ok(None) => return pass.retry_soon(),
        Err(e) => {
            let msg = format!("Error reading ControllerRevision {name}: {}", writer::message(&e));
            failed(pass, &rev, "FailedCreate", msg, false).await;
            return;
        }
    };
    take_existing(pass, &live, hash).await;
}

/// A revision of the name the pass wanted to create exists: put back its labels when it is this
/// NodeSet's, adopt it when it is nobody's, report it when it is someone else's.
async fn take_existing(pass: &mut Pass<'_>, live: &ControllerRevision, hash: &str) {
    let ns = pass.ns;
    let name = live.name_any();
    match live
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
    {
        Some(o) if o.uid == pass.uid => {
            if labelled(ns, live, hash) {
                // The cache has not shown it yet.
                pass.retry_soon();
                return;
            }
            let mut labels = ns.selector_labels();
            labels.insert(keys::LABEL_REVISION_HASH.into(), hash.into());
            match pass
                .core()
                .writer
                .patch_revision(live, json!({"metadata": {"labels": labels}}))
                .await
            {
                Ok(_) => tracing::info!(revision = %name, "put back the labels of a revision"),
                Err(e) if writer::is_conflict(&e) => pass.retry_soon(),
                Err(e) => {
                    let msg = format!(
                        "Error labelling ControllerRevision {name}: {}",
                        writer::message(&e)
                    );
                    failed(pass, live, "FailedUpdate", msg, false).await;
                }
            }
        }
        None => {
            if may_adopt(pass, live).await {
                adopt(pass, live, Some(hash)).await;
            }
        }
        Some(o) => {
            let whose = if o.kind == "NodeSet" && o.name == ns.name_any() {
                format!(
                    "a previous NodeSet {} (uid {}) and awaits garbage collection",
                    o.name, o.uid
                )
            } else {
                format!("{} {}", o.kind, o.name)
            };
            let msg = format!(
                "ControllerRevision {name} belongs to {whose}: revision {hash} is not recorded \
                 (its pods roll all the same) until that object is gone"
            );
            failed(pass, live, "NotOwned", msg, true).await;
        }
    }
}

/// Delete the revisions beyond `spec.revisionHistoryLimit` (see [`plan_truncate`]): `history` as
/// [`record`] returned it, `pods` every pod the NodeSet owns (terminating ones included).
pub(super) async fn truncate(
    pass: &mut Pass<'_>,
    history: &[Arc<ControllerRevision>],
    pods: &[Arc<Pod>],
    hash: &str,
) {
    let ns = pass.ns;
    let limit = ns.spec.revision_history_limit.unwrap_or(0).max(0) as usize;
    let live = live_revisions(ns, hash, pods);
    for r in plan_truncate(history, &live, limit) {
        let (namespace, name) = (r.namespace().unwrap_or_default(), r.name_any());
        let uid = r.uid().unwrap_or_default();
        match pass.core().writer.delete_revision(&namespace, &name, &uid).await {
            Ok(_) => tracing::info!(revision = %name, number = number(&r), limit, "deleted an old revision"),
            // The name belongs to another object now: not ours to delete.
            Err(e) if writer::is_conflict(&e) => tracing::debug!(revision = %name, "{}", writer::message(&e)),
            Err(e) => {
                let msg = format!(
                    "Error deleting ControllerRevision {name}: {}",
                    writer::message(&e)
                );
                failed(pass, &r, "FailedDelete", msg, false).await;
            }
        }
    }
}

#[cfg(test)]
mod tests;
