//! Which pods are a NodeSet's: owned pods, orphans it may adopt, owned pods it must release, and
//! the ordinals whose pod names are held by pods it does not own ("blocked"): those ordinals
//! count as used, so a stranger named `<nodeset>-N` never stops the other ordinals from being
//! created, and the NodeSet never creates a second pod for a name that is taken.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use slinky_api::NodeSet;

/// A pod holding an ordinal's name that the NodeSet does not own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    /// The pod's name.
    pub pod: String,
    /// Why it is not the NodeSet's, for the Event.
    pub why: String,
}

/// The NodeSet's view of the pods of its namespace.
#[derive(Debug, Default)]
pub struct Claims {
    /// Pods the NodeSet controls and that carry its selector labels.
    pub owned: Vec<Arc<Pod>>,
    /// Orphans with its selector labels and one of its ordinal names: to adopt.
    pub adopt: Vec<Arc<Pod>>,
    /// Pods it controls that lost its selector labels: to release.
    pub release: Vec<Arc<Pod>>,
    /// Ordinals whose names are held by pods it does not own (adoption candidates included until
    /// adopted).
    pub blocked: BTreeMap<u32, Blocker>,
    /// Of those, the ordinals whose holders are on their way out: being deleted, or controlled
    /// by a previous NodeSet of this name (deleted and recreated: the garbage collector deletes
    /// its pods). These ordinals wait for their names to free rather than being skipped.
    pub leaving: std::collections::BTreeSet<u32>,
    /// UIDs of owned pods of another revision scheme not compared with the builders' output yet
    /// (filled by the relabelling): a rolling update leaves them alone until they are.
    pub unjudged: std::collections::HashSet<String>,
}

/// Whether `pod` is named as a DaemonSet-mode pod of `nodeset` would be (`<nodeset>-<hostname>`).
fn daemon_name(nodeset: &NodeSet, pod: &str) -> bool {
    nodeset.is_daemon()
        && pod
            .strip_prefix(&format!("{}-", nodeset.name_any()))
            .is_some_and(|h| !h.is_empty())
}

/// Sort `pods` (any namespace) into what `nodeset` owns, may adopt, must release and cannot use.
pub fn classify(nodeset: &NodeSet, pods: impl IntoIterator<Item = Arc<Pod>>) -> Claims {
    let namespace = nodeset.namespace().unwrap_or_default();
    let uid = nodeset.uid().unwrap_or_default();
    let selector = nodeset.selector_labels();
    let matches = |p: &Pod| selector.iter().all(|(k, v)| p.labels().get(k) == Some(v));
    let prefix = format!("{}-", nodeset.name_any());
    let mut claims = Claims::default();
    for p in pods {
        if p.metadata.namespace.as_deref() != Some(namespace.as_str()) {
            continue;
        }
        // A pod neither controlled by this NodeSet nor named like its pods (`<nodeset>-…`: its
        // ordinals, its DaemonSet-mode names) is none of its business: skipped before any
        // allocation, since every pass sees every pod of the namespace (10,000 of them, for
        // 100 NodeSets).
        let ours = p
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && o.uid == uid);
        if !ours && !p.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix)) {
            continue;
        }
        let ordinal = nodeset.pod_ordinal(&p.name_any());
        let controller = p.owner_references().iter().find(|o| o.controller == Some(true));
        let leaving = p.metadata.deletion_timestamp.is_some()
            || controller
                .is_some_and(|o| o.kind == "NodeSet" && o.name == nodeset.name_any() && o.uid != uid);
        let why = match controller {
            Some(o) if o.uid == uid && matches(&p) => {
                claims.owned.push(p);
                continue;
            }
            Some(o) if o.uid == uid => {
                claims.release.push(p.clone());
                "it no longer carries the NodeSet's selector labels and is being released".to_string()
            }
            Some(o) if leaving => format!(
                "it belongs to a previous NodeSet {} (uid {}) and awaits garbage collection",
                o.name, o.uid
            ),
            Some(o) => format!("it is controlled by {} {}", o.kind, o.name),
            None if p.metadata.deletion_timestamp.is_some() => "it is an orphan being deleted".to_string(),
            None if matches(&p) && (ordinal.is_some() || daemon_name(nodeset, &p.name_any())) => {
                claims.adopt.push(p.clone());
                "it is an orphan not adopted yet".to_string()
            }
            None => {
                let labels: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!(
                    "it has no controller and lacks the NodeSet's selector labels ({})",
                    labels.join(", ")
                )
            }
        };
        if let Some(o) = ordinal {
            if leaving {
                claims.leaving.insert(o);
            }
            claims.blocked.insert(
                o,
                Blocker {
                    pod: p.name_any(),
                    why,
                },
            );
        }
    }
    claims
}

#[cfg(test)]
mod tests {
    use slinky_api::pods::ordinal_after;

    use super::*;
    use crate::reconcile::nodeset::fixtures::{nodeset, pod};

    #[test]
    fn only_the_nodesets_own_padding_is_an_ordinal_name() {
        let w = nodeset("w", 3);
        assert_eq!(w.pod_ordinal("w-7"), Some(7));
        assert_eq!(w.pod_ordinal("w-07"), None);
        assert_eq!(w.pod_ordinal("w-x"), None);
        assert_eq!(w.pod_ordinal("ww-1"), None);
        assert_eq!(w.pod_ordinal("w-"), None);
        let mut padded = nodeset("w", 3);
        padded.spec.ordinal_padding = Some(2);
        assert_eq!(padded.pod_ordinal("w-07"), Some(7));
        assert_eq!(padded.pod_ordinal("w-7"), None);
        assert_eq!(padded.pod_ordinal("w-100"), Some(100));
        assert_eq!(ordinal_after(&padded.name_any(), "w-7"), Some(7));
    }

    #[test]
    fn strangers_block_their_ordinal_orphans_are_adopted_lost_pods_released() {
        let w = nodeset("w", 3);
        let pods = vec![
            pod(&w, 0).owned().arc(),
            pod(&w, 1).stranger("ReplicaSet", "web").arc(),
            pod(&w, 2).orphan().arc(),
            pod(&w, 3).owned().labels_lost().arc(),
            pod(&w, 4).orphan().without_selector().arc(),
            pod(&w, 5).orphan().terminating().arc(),
            pod(&w, 6).owned().in_namespace("other").arc(),
            pod(&w, 7).stranger("NodeSet", "w").arc(),
        ];
        let c = classify(&w, pods);
        let names = |v: &[Arc<Pod>]| v.iter().map(|p| p.name_any()).collect::<Vec<_>>();
        assert_eq!(names(&c.owned), ["w-0"]);
        assert_eq!(names(&c.adopt), ["w-2"]);
        assert_eq!(names(&c.release), ["w-3"]);
        assert_eq!(c.blocked.keys().copied().collect::<Vec<_>>(), [1, 2, 3, 4, 5, 7]);
        assert_eq!(
            c.leaving.iter().copied().collect::<Vec<_>>(),
            [5, 7],
            "terminating, predecessor's"
        );
        assert_eq!(c.blocked[&1].why, "it is controlled by ReplicaSet web");
        assert!(c.blocked[&4].why.contains("lacks the NodeSet's selector labels"));
    }
}
