//! A NodeSet's per-pod volume claims (`spec.volumeClaimTemplates`): made before their pod, and
//! owned as `spec.persistentVolumeClaimRetentionPolicy` says, as the StatefulSet controller and
//! Slinky do.
//!
//! # Guarantees
//! * A pod is created only once each of its claims exists and is not being deleted (a claim
//!   being deleted would leave the pod Pending on it). A claim being deleted holds only its pod
//!   (`FailedCreate` Event, `ReplicaFailure`, backoff; the other ordinals are created), and the
//!   claim watch brings the NodeSet back when it is gone; a refused claim create stops the
//!   pass's creates like a refused pod create.
//! * `whenDeleted: Delete`: every claim of a kept pod carries a plain owner reference to the
//!   NodeSet (the garbage collector deletes it with the NodeSet); `Retain` removes it.
//! * `whenScaled: Delete`: just before a pod is deleted by a scale-in, its claims get a plain
//!   owner reference to it, their only one (the garbage collector deletes them after the pod); a
//!   pod deleted for an update or because it finished keeps its claims for its replacement. A pod
//!   whose claims could not be given to it is not deleted in that pass.
//! * Owner references of other owners are kept. Owner writes carry the claim's resourceVersion.
//!
//! # Caveats
//! A claim made by someone else between the cache's view and our create (409) is taken as it is;
//! its owners are set by the next pass.

use std::sync::Arc;

use k8s_openapi::{
    api::core::v1::{PersistentVolumeClaim, Pod},
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use slinky_api::{
    NodeSet,
    claims::{Retention, RetentionPolicy, claim_owners},
    owners::controller_ref,
};

use super::{Pass, plan::DeleteReason};
use crate::reconcile::core::writer;

/// The cached claim `name` of the NodeSet's namespace.
fn cached(pass: &Pass<'_>, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
    let ns = pass.ns.namespace().unwrap_or_default();
    pass.ctx.caches.claims.get(&ObjectRef::new(name).within(&ns))
}

fn policy(ns: &NodeSet) -> RetentionPolicy {
    // An invalid policy stops the pass before any pod is written (`spec_problems`).
    ns.retention_policy().unwrap_or_default()
}

fn nodeset_ref(ns: &NodeSet) -> Option<OwnerReference> {
    controller_ref(ns)
}

/// Why a pod's claims are not all there.
pub(super) struct Missing {
    /// What happened, naming the claim and the pod.
    pub(super) message: String,
    /// A claim is being deleted: only this pod waits (the batch goes on), unlike a refused create.
    pub(super) deleting: bool,
}

/// Make the claims of the pod named `pod` that do not exist yet. `Ok` with the claims made;
/// `Err` when one could not be made or is being deleted (the pod must not be created then).
pub(super) async fn ensure(pass: &Pass<'_>, pod: &str) -> Result<Vec<String>, Missing> {
    let ns = pass.ns;
    let claims = ns.claims_of_pod(pod);
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let (policy, pod) = (policy(ns), pod.to_string());
    let owner = nodeset_ref(ns).ok_or_else(|| Missing {
        message: format!("NodeSet {} has no UID yet", ns.name_any()),
        deleting: false,
    })?;
    let mut made = Vec::new();
    for mut claim in claims {
        let name = claim.name_any();
        match cached(pass, &name) {
            Some(c) if c.metadata.deletion_timestamp.is_some() => {
                return Err(Missing {
                    message: format!(
                        "claim {name} of pod {pod} is being deleted: the pod is created once it is gone"
                    ),
                    deleting: true,
                });
            }
            Some(_) => {}
            None => {
                let owners = claim_owners(&[], policy, &owner, &pod, None);
                claim.metadata.owner_references = (!owners.is_empty()).then_some(owners);
                match pass.core().writer.create_claim(&claim).await {
                    Ok(_) => made.push(name),
                    // Made meanwhile (our cache had not shown it): used as it is.
                    Err(e) if writer::is_already_exists(&e) => {}
                    Err(e) => {
                        return Err(Missing {
                            message: format!(
                                "Error creating claim {name} of pod {pod}: {}",
                                writer::message(&e)
                            ),
                            deleting: false,
                        });
                    }
                }
            }
        }
    }
    Ok(made)
}

/// Bring the claims' owner references in line with the retention policy: the kept pods' claims
/// (`owned` minus `deletes`), and the claims of pods deleted now by a scale-in (owned by the pod
/// under `whenScaled: Delete`). Returns `deletes` without the pods whose claims could not be
/// given to them: such a pod is deleted by a later pass, once its claims go with it. A 409 (our
/// cache had not shown our previous write yet) brings the NodeSet back within seconds, quietly;
/// other refusals are Events and `ReplicaFailure`.
pub(super) async fn sync_owners(
    pass: &mut Pass<'_>,
    owned: &[Arc<Pod>],
    deletes: Vec<(Arc<Pod>, DeleteReason)>,
) -> Vec<(Arc<Pod>, DeleteReason)> {
    let ns = pass.ns;
    if ns.spec.volume_claim_templates.is_empty() {
        return deletes;
    }
    let Some(owner) = nodeset_ref(ns) else {
        return deletes;
    };
    let policy = policy(ns);
    let deleting = |p: &Pod| deletes.iter().any(|(d, _)| d.uid() == p.uid());
    // (claim, its owners, the pod scaled away whose delete waits for this write)
    let mut wanted: Vec<(Arc<PersistentVolumeClaim>, Vec<OwnerReference>, Option<String>)> = Vec::new();
    let pods = owned
        .iter()
        .filter(|p| !deleting(p) && p.metadata.deletion_timestamp.is_none())
        .map(|p| (p, false))
        .chain(
            deletes
                .iter()
                .filter(|(_, why)| *why == DeleteReason::ScaleDown)
                .map(|(p, _)| (p, true)),
        );
    for (pod, scaled_away) in pods {
        let pod_ref = (scaled_away && policy.when_scaled == Retention::Delete)
            .then(|| controller_ref(pod.as_ref()))
            .flatten();
        for claim in ns.claims_of_pod(&pod.name_any()) {
            let Some(current) = cached(pass, &claim.name_any()) else {
                continue;
            };
            let have = current.metadata.owner_references.clone().unwrap_or_default();
            let want = claim_owners(&have, policy, &owner, &pod.name_any(), pod_ref.as_ref());
            if !same_owners(&have, &want) {
                let waits = pod_ref.as_ref().and_then(|_| pod.uid());
                wanted.push((current, want, waits));
            }
        }
    }
    let mut held = Vec::new();
    for (claim, owners, waits) in wanted {
        let value = serde_json::to_value(&owners).unwrap_or_default();
        let Err(e) = pass.core().writer.set_claim_owners(&claim, value).await else {
            continue;
        };
        held.extend(waits);
        if writer::is_conflict(&e) {
            tracing::debug!(claim = %claim.name_any(), "claim changed since our cache saw it; again soon");
            pass.retry_soon();
        } else {
            pass.failed(
                "FailedUpdate",
                format!(
                    "Error setting the owners of claim {} (persistentVolumeClaimRetentionPolicy): {}",
                    claim.name_any(),
                    writer::message(&e)
                ),
            )
            .await;
        }
    }
    deletes
        .into_iter()
        .filter(|(p, _)| p.uid().is_none_or(|uid| !held.contains(&uid)))
        .collect()
}

/// The same references, in any order (compared by UID and the fields the policy sets).
fn same_owners(a: &[OwnerReference], b: &[OwnerReference]) -> bool {
    let key = |r: &OwnerReference| (r.uid.clone(), r.controller, r.block_owner_deletion);
    let mut a: Vec<_> = a.iter().map(key).collect();
    let mut b: Vec<_> = b.iter().map(key).collect();
    a.sort();
    b.sort();
    a == b
}
