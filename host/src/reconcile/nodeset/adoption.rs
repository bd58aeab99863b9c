//! Pods that exist before this pass decides anything: orphans matching the NodeSet are adopted,
//! owned pods that lost the selector labels are released, owned pods labelled by another
//! revision scheme whose content equals what the builder makes are relabelled, not replaced, and
//! pods whose only change is their builder get its annotations patched in place. A DaemonSet-mode
//! pod is compared bound to its node, whatever its name (Slinky's are generated), and gets the
//! daemon tolerations it lacks in place.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use futures::future::join_all;

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use serde_json::Value;
use slinky_api::{Controller, NodeSet, keys, owners::controller_ref, placement};

use super::{Pass, classify::Claims, differing, plan, pods::build_pods};
use crate::{
    plugins::{Pipeline, PodIdentity},
    reconcile::{Error, core::compare::contains, core::writer},
    revision::{is_output_revision, provenance},
};

/// Adopt matching orphans (after re-reading the NodeSet from the API: only a live, undeleted
/// owner adopts) and release owned pods that lost the selector labels.
pub(super) async fn adopt_and_release(pass: &mut Pass<'_>, claims: &mut Claims) -> Result<(), Error> {
    let (ns, core) = (pass.ns, pass.ctx.core.as_ref());
    if !claims.adopt.is_empty() {
        let api: Api<NodeSet> = Api::namespaced(core.client.clone(), &ns.namespace().unwrap_or_default());
        let fresh = api.get(&ns.name_any()).await?;
        // `controller_ref` is `None` only for a NodeSet without a UID, which the API never returns.
        if let Some(ours) = controller_ref(ns)
            && fresh.uid().as_deref() == Some(pass.uid.as_str())
            && fresh.metadata.deletion_timestamp.is_none()
        {
            for p in std::mem::take(&mut claims.adopt) {
                let mut refs = p.owner_references().to_vec();
                refs.push(ours.clone());
                match core.writer.set_pod_owners(&p, owners(&refs)).await {
                    Ok(adopted) => {
                        if let Some(o) = ns.pod_ordinal(&p.name_any()) {
                            claims.blocked.remove(&o);
                        }
                        claims.owned.push(Arc::new(adopted));
                    }
                    Err(e) => {
                        let msg = format!("Error adopting pod {}: {}", p.name_any(), writer::message(&e));
                        if let Some(b) = ns
                            .pod_ordinal(&p.name_any())
                            .and_then(|o| claims.blocked.get_mut(&o))
                        {
                            b.why = format!("its adoption failed: {}", writer::message(&e));
                        }
                        pass.failed("FailedAdopt", msg).await;
                    }
                }
            }
        }
    }
    for p in std::mem::take(&mut claims.release) {
        let refs: Vec<OwnerReference> = p
            .owner_references()
            .iter()
            .filter(|o| o.uid != pass.uid)
            .cloned()
            .collect();
        if let Err(e) = core.writer.set_pod_owners(&p, owners(&refs)).await {
            let msg = format!("Error releasing pod {}: {}", p.name_any(), writer::message(&e));
            pass.failed("FailedRelease", msg).await;
        }
    }
    Ok(())
}

fn owners(refs: &[OwnerReference]) -> Value {
    serde_json::to_value(refs).unwrap_or(Value::Null)
}

/// A pod's UID and resourceVersion.
fn version(p: &Pod) -> (String, String) {
    (
        p.uid().unwrap_or_default(),
        p.resource_version().unwrap_or_default(),
    )
}

/// Whether a live pod carries a revision of another scheme than this host's output revisions
/// (an earlier host's input hash, Slinky's bare FNV hash, none): what it runs is known only
/// by comparing it with what the builders make.
fn other_scheme(pod: &Pod, revision: &str) -> bool {
    let label = pod.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str);
    label != Some(revision) && !label.is_some_and(is_output_revision)
}

/// The live pods of another revision scheme that have an identity: `(index in owned, identity)`.
fn other_scheme_pods(ns: &NodeSet, owned: &[Arc<Pod>], revision: &str) -> Vec<(usize, PodIdentity)> {
    owned
        .iter()
        .enumerate()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none() && other_scheme(p, revision))
        .filter_map(|(i, p)| PodIdentity::of_pod(ns, p, revision).map(|id| (i, id)))
        .collect()
}

/// Owned pods labelled with another revision scheme (a host before output revisions, Slinky's
/// bare FNV hash) whose content equals what the builders make for their identity get this
/// revision's label instead of being replaced: upgrading the host, or switching from Slinky,
/// does not roll the fleet. A pod found to differ is not built and compared again until it or
/// the NodeSet changes ([`super::differing`]).
///
/// Returns the UIDs of such pods not judged yet (beyond this pass's burst, or not readable): a
/// rolling update leaves them alone until they are.
pub(super) async fn relabel_equal_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    owned: &mut [Arc<Pod>],
    plugin: &Pipeline,
) -> Result<HashSet<String>, Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    let core = ctx.core.as_ref();
    let inputs = differing::inputs(ns, revision);
    let nodesets = &ctx.caches.nodesets;
    ctx.differing.retain_nodesets(|namespace, name, uid| {
        nodesets
            .get(&ObjectRef::<NodeSet>::new(name).within(namespace))
            .is_some_and(|n| n.uid().as_deref() == Some(uid))
    });
    let others = other_scheme_pods(ns, owned, revision);
    ctx.differing
        .retain_pods(&pass.uid, others.iter().filter_map(|(i, _)| owned[*i].uid()));
    let mut unjudged: HashSet<String> = others
        .iter()
        .filter(|(i, _)| {
            let (uid, rv) = version(&owned[*i]);
            !ctx.differing.differs(&pass.uid, &uid, &rv, &inputs)
        })
        .filter_map(|(i, _)| owned[*i].uid())
        .collect();
    let candidates: Vec<(usize, PodIdentity)> = others
        .into_iter()
        .filter(|(i, _)| owned[*i].uid().is_some_and(|u| unjudged.contains(&u)))
        .take(plan::BURST)
        .collect();
    if candidates.is_empty() {
        return Ok(unjudged);
    }
    let (indices, identities): (Vec<usize>, Vec<PodIdentity>) = candidates.into_iter().unzip();
    let built = match build_pods(core, ns, controller, plugin, identities).await? {
        Ok(built) => built,
        Err(e) => {
            pass.state.builder_error(&e).await;
            return Ok(unjudged);
        }
    };
    for (i, want) in indices.into_iter().zip(built) {
        let uid = owned[i].uid().unwrap_or_default();
        // The cache keeps pods without most of their spec: compare the pod as the server has it.
        let have = match core
            .writer
            .get_pod(&have_ns(&owned[i]), &owned[i].name_any())
            .await
        {
            Ok(Some(p)) if p.uid() == owned[i].uid() => Arc::new(p),
            // Gone or replaced meanwhile: its event will bring the next pass.
            Ok(_) => continue,
            Err(e) => {
                tracing::info!(pod = %owned[i].name_any(), error = %writer::message(&e), "cannot read the pod to compare it; next pass");
                pass.retry_soon = true;
                continue;
            }
        };
        let have = &have;
        // DaemonSet mode: bound to its node as the pod is (the DaemonSet controller's rule).
        let node = ns.is_daemon().then(|| placement::target_node(have)).flatten();
        let mut want = want;
        if let Some(node) = &node {
            placement::pin_to_node(want.spec.get_or_insert_default(), node);
        }
        // Compare with what the server would store of ours (its defaults, its dropped fields).
        let (stored, dry_run) = match core.writer.dry_run_pod(&want).await {
            Ok(stored) => (stored, true),
            Err(e) => {
                tracing::info!(pod = %have.name_any(), error = %writer::message(&e), "dry run failed; comparing with the built pod");
                (want.clone(), false)
            }
        };
        if !same_pod(have, &stored, ns) {
            if !dry_run {
                // Compared with the pod as built, not as the API server would store it: not
                // enough to replace it on. It stays unjudged; the next pass compares again.
                pass.retry_soon = true;
                continue;
            }
            // Judged: it differs, and rolls in its turn.
            unjudged.remove(&uid);
            let (uid, rv) = version(have);
            tracing::debug!(pod = %have.name_any(), rv, "differs from the builder's pod; not compared again until it or the NodeSet changes");
            ctx.differing.remember(ns, &uid, &rv, &inputs);
            continue;
        }
        let labels = BTreeMap::from([(keys::LABEL_REVISION_HASH.to_string(), revision.to_string())]);
        // A daemon pod made without the daemon tolerations (Slinky's, its #259) gets them in
        // place: it stays on a node that is cordoned or not ready, as the host's own pods do.
        let mut spec = have.spec.clone().unwrap_or_default();
        let tolerations =
            (node.is_some() && placement::add_daemon_tolerations(&mut spec)).then_some(spec.tolerations);
        match core
            .writer
            .relabel_pod(
                have,
                &labels,
                &provenance(&want),
                tolerations.flatten().as_deref(),
            )
            .await
        {
            Ok(p) => {
                unjudged.remove(&uid);
                owned[i] = Arc::new(p);
            }
            Err(e) => {
                let msg = format!(
                    "Error relabelling pod {}: {}",
                    have.name_any(),
                    writer::message(&e)
                );
                pass.failed("FailedUpdate", msg).await;
            }
        }
    }
    Ok(unjudged)
}

/// Pods of this revision whose builder annotations name another builder than the one building
/// it now (the same output from another plugin, pipeline or host): their annotations are patched
/// in place, at most a burst a pass. The pod restarts for nothing of it.
pub(super) async fn refresh_provenance(
    pass: &mut Pass<'_>,
    revision: &str,
    provenance: &BTreeMap<String, String>,
    owned: &mut [Arc<Pod>],
) {
    if provenance.is_empty() {
        return;
    }
    let stale: Vec<usize> = owned
        .iter()
        .enumerate()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| p.labels().get(keys::LABEL_REVISION_HASH).map(String::as_str) == Some(revision))
        .filter(|(_, p)| provenance.iter().any(|(k, v)| p.annotations().get(k) != Some(v)))
        .map(|(i, _)| i)
        .take(plan::BURST)
        .collect();
    let core = pass.core();
    let results = join_all(stale.iter().map(|&i| {
        let pod = owned[i].clone();
        async move {
            (
                i,
                core.writer
                    .relabel_pod(&pod, &BTreeMap::new(), provenance, None)
                    .await,
            )
        }
    }))
    .await;
    for (i, r) in results {
        match r {
            Ok(p) => owned[i] = Arc::new(p),
            // Changed meanwhile: its event brings the next pass, which looks again.
            Err(e) if writer::is_conflict(&e) || writer::is_not_found(&e) => pass.retry_soon = true,
            Err(e) => {
                let msg = format!(
                    "Error updating the builder annotations of pod {}: {}",
                    owned[i].name_any(),
                    writer::message(&e)
                );
                pass.failed("FailedUpdate", msg).await;
            }
        }
    }
}

fn have_ns(p: &Pod) -> String {
    p.namespace().unwrap_or_default()
}

/// Whether a live pod has the labels, annotations and spec of `want` (our pod as stored), but
/// for the revision label, the builder annotations, and what `want` carries from `nodeset`'s own
/// labels and annotations (no input of the revision: a pod made before `kubectl label nodeset`
/// is not replaced for it).
fn same_pod(have: &Pod, want: &Pod, nodeset: &NodeSet) -> bool {
    let none = BTreeMap::new();
    contains(
        &comparable(have, &none, &none),
        &comparable(want, nodeset.labels(), nodeset.annotations()),
    )
}

/// `p`'s labels, annotations and spec, without the revision label, the builder annotations and
/// the labels and annotations equal to `own_labels` and `own_annotations`.
fn comparable(
    p: &Pod,
    own_labels: &BTreeMap<String, String>,
    own_annotations: &BTreeMap<String, String>,
) -> Value {
    let mut labels = p.labels().clone();
    labels.remove(keys::LABEL_REVISION_HASH);
    labels.retain(|k, v| own_labels.get(k) != Some(v));
    let mut annotations = p.annotations().clone();
    annotations.remove(keys::ANNOTATION_BUILDER);
    annotations.remove(keys::ANNOTATION_BUILDER_DIGEST);
    annotations.retain(|k, v| own_annotations.get(k) != Some(v));
    serde_json::json!({"labels": labels, "annotations": annotations, "spec": p.spec})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::nodeset::fixtures::{nodeset, pod};

    #[test]
    fn a_pod_made_before_the_nodeset_was_labelled_is_the_same_pod() {
        let mut w = nodeset("w", 1);
        w.metadata.labels = Some(BTreeMap::from([("team".to_string(), "hpc".to_string())]));
        let have = pod(&w, 0).revision("0123456789").arc();
        let want = pod(&w, 0).revision("0123456789ab").label("team", "hpc").arc();
        assert!(
            same_pod(&have, &want, &w),
            "the NodeSet's own label is no difference"
        );
        let other = pod(&w, 0).label("team", "ops").arc();
        assert!(
            !same_pod(&have, &other, &w),
            "a label the NodeSet does not have with that value is one"
        );
        let image = pod(&w, 0).on_node("node-9").arc();
        assert!(!same_pod(&have, &image, &w), "a spec field is one");
    }
}
