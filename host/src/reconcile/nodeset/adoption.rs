//! Pods that exist before this pass decides anything: orphans matching the NodeSet are adopted,
//! owned pods that lost the selector labels are released, and owned pods labelled by another
//! revision scheme whose content equals what the builder makes are relabelled, not replaced.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::OwnerReference};
use kube::{Api, ResourceExt, runtime::reflector::ObjectRef};
use serde_json::Value;
use slinky_api::{Controller, NodeSet, keys, owners::controller_ref};

use super::{Pass, classify::Claims, differing, plan, pods::build_pods};
use crate::{
    plugins::{Pipeline, PodIdentity},
    reconcile::{Error, core::compare::contains, core::writer},
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

/// The pods labelled by Slinky (a revision hash `<nodeset>-…`) worth comparing with what the
/// builder makes: live, of an ordinal of this NodeSet, not found to differ since they last
/// changed; at most a burst. `(index in owned, ordinal)`.
fn relabel_candidates(pass: &Pass<'_>, owned: &[Arc<Pod>], inputs: &str) -> Vec<(usize, u32)> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    let foreign = format!("{}-", ns.name_any());
    let nodesets = &ctx.caches.nodesets;
    ctx.differing.retain_nodesets(|namespace, name, uid| {
        nodesets
            .get(&ObjectRef::<NodeSet>::new(name).within(namespace))
            .is_some_and(|n| n.uid().as_deref() == Some(uid))
    });
    let labelled: Vec<(usize, u32)> = owned
        .iter()
        .enumerate()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .filter(|(_, p)| {
            p.labels()
                .get(keys::LABEL_REVISION_HASH)
                .is_some_and(|r| r.starts_with(&foreign))
        })
        .filter_map(|(i, p)| ns.pod_ordinal(&p.name_any()).map(|o| (i, o)))
        .collect();
    ctx.differing
        .retain_pods(&pass.uid, labelled.iter().filter_map(|(i, _)| owned[*i].uid()));
    labelled
        .into_iter()
        .filter(|(i, _)| {
            let (uid, rv) = version(&owned[*i]);
            !ctx.differing.differs(&pass.uid, &uid, &rv, inputs)
        })
        .take(plan::BURST)
        .collect()
}

/// Owned pods labelled with another revision scheme (Slinky's `<nodeset>-<hash>`) whose content
/// equals what the active builder makes for their ordinal get this revision's label instead of
/// being replaced: switching from Slinky does not roll the fleet. A pod found to differ is not
/// built and compared again until it or the NodeSet changes ([`super::differing`]).
pub(super) async fn relabel_equal_pods(
    pass: &mut Pass<'_>,
    controller: &Controller,
    revision: &str,
    owned: &mut [Arc<Pod>],
    plugin: &Pipeline,
) -> Result<(), Error> {
    let (ns, ctx) = (pass.ns, pass.ctx);
    let core = ctx.core.as_ref();
    let inputs = differing::inputs(ns, revision);
    let candidates = relabel_candidates(pass, owned, &inputs);
    if candidates.is_empty() {
        return Ok(());
    }
    let identities: Vec<PodIdentity> = candidates
        .iter()
        .map(|(_, o)| PodIdentity::for_ordinal(ns, *o, revision))
        .collect();
    let built = match build_pods(core, ns, controller, plugin, identities).await? {
        Ok(built) => built,
        Err(e) => {
            pass.state.builder_error(&e).await;
            return Ok(());
        }
    };
    for ((i, _), want) in candidates.into_iter().zip(built) {
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
        // Compare with what the server would store of ours (its defaults, its dropped fields).
        let (stored, dry_run) = match core.writer.dry_run_pod(&want).await {
            Ok(stored) => (stored, true),
            Err(e) => {
                tracing::info!(pod = %have.name_any(), error = %writer::message(&e), "dry run failed; comparing with the built pod");
                (want.clone(), false)
            }
        };
        if !same_pod(have, &stored) {
            if dry_run {
                let (uid, rv) = version(have);
                tracing::debug!(pod = %have.name_any(), rv, "differs from the builder's pod; not compared again until it or the NodeSet changes");
                ctx.differing.remember(ns, &uid, &rv, &inputs);
            }
            continue;
        }
        let labels = BTreeMap::from([(keys::LABEL_REVISION_HASH.to_string(), revision.to_string())]);
        let annotations: BTreeMap<String, String> = want
            .annotations()
            .iter()
            .filter(|(k, _)| {
                k.as_str() == keys::ANNOTATION_BUILDER || k.as_str() == keys::ANNOTATION_BUILDER_DIGEST
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match core.writer.relabel_pod(have, &labels, &annotations).await {
            Ok(p) => owned[i] = Arc::new(p),
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
    Ok(())
}

fn have_ns(p: &Pod) -> String {
    p.namespace().unwrap_or_default()
}

/// Whether a live pod has the labels, annotations and spec of `want` (our pod as stored), but
/// for the revision label and the builder annotations.
fn same_pod(have: &Pod, want: &Pod) -> bool {
    let strip = |p: &Pod| {
        let mut labels = p.labels().clone();
        labels.remove(keys::LABEL_REVISION_HASH);
        let mut annotations = p.annotations().clone();
        annotations.remove(keys::ANNOTATION_BUILDER);
        annotations.remove(keys::ANNOTATION_BUILDER_DIGEST);
        serde_json::json!({"labels": labels, "annotations": annotations, "spec": p.spec})
    };
    contains(&strip(have), &strip(want))
}
