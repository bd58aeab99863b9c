//! Pods labelled by Slinky that were found to differ from what the builder makes, remembered so
//! that they are not built and dry-run again on every pass. Such a pod stays under `OnDelete`
//! (and until its turn in a rolling update): without this memo, each pass (every resync, every
//! pod event) would cost a builder call and a dry-run POST per pod, up to [`super::plan::BURST`].
//!
//! # Guarantees
//! * A pod is compared again when it changes (another resourceVersion) or when what it is
//!   compared with may have changed: another pod revision (template, builder, Controller, …), or
//!   other NodeSet labels or annotations (the builder copies them onto pods; the revision does
//!   not cover them, so that labelling a NodeSet rolls nothing).
//! * Memory is bounded by the pods that exist: a pass keeps only its NodeSet's current
//!   candidates (gone, terminating or relabelled pods are dropped), and NodeSets no longer in the
//!   cache (deleted, or recreated under another UID) are dropped whole.
//!
//! # Caveats
//! Only differences found against the API server's dry run are remembered: a comparison whose
//! dry run failed (made against the built pod instead) is made again at the next pass.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
};

use kube::ResourceExt;
use serde_json::json;
use sha2::{Digest, Sha256};
use slinky_api::NodeSet;

/// What a pod was last compared under.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Compared {
    /// The pod's resourceVersion.
    resource_version: String,
    /// [`inputs`] of its NodeSet.
    inputs: String,
}

/// One NodeSet's remembered pods.
#[derive(Debug, Default)]
struct Entry {
    /// Where the NodeSet is (to find it in the cache).
    namespace: String,
    /// Its name.
    name: String,
    /// Pod UID → what it was found to differ under.
    pods: HashMap<String, Compared>,
}

/// The pods found to differ, per NodeSet UID.
#[derive(Debug, Default)]
pub struct DifferingPods {
    entries: Mutex<HashMap<String, Entry>>,
}

/// What a comparison of `nodeset`'s pods depends on besides the pod: the pod revision and the
/// NodeSet's labels and annotations.
pub fn inputs(nodeset: &NodeSet, revision: &str) -> String {
    let meta = json!({"labels": nodeset.labels(), "annotations": nodeset.annotations()});
    let digest = Sha256::digest(meta.to_string().as_bytes());
    format!("{revision}/{}", hex::encode(&digest[..8]))
}

impl DifferingPods {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Entry>) -> R) -> R {
        crate::reconcile::core::locked(&self.entries, f)
    }

    /// Whether pod `pod_uid` of NodeSet `nodeset_uid` was found to differ at `resource_version`
    /// under `inputs`.
    pub fn differs(&self, nodeset_uid: &str, pod_uid: &str, resource_version: &str, inputs: &str) -> bool {
        self.with(|m| {
            m.get(nodeset_uid)
                .and_then(|e| e.pods.get(pod_uid))
                .is_some_and(|c| c.resource_version == resource_version && c.inputs == inputs)
        })
    }

    /// Remember that pod `pod_uid` of `nodeset` differs at `resource_version` under `inputs`.
    pub fn remember(&self, nodeset: &NodeSet, pod_uid: &str, resource_version: &str, inputs: &str) {
        let uid = nodeset.uid().unwrap_or_default();
        self.with(|m| {
            let e = m.entry(uid).or_insert_with(|| Entry {
                namespace: nodeset.namespace().unwrap_or_default(),
                name: nodeset.name_any(),
                pods: HashMap::new(),
            });
            e.pods.insert(
                pod_uid.to_string(),
                Compared {
                    resource_version: resource_version.to_string(),
                    inputs: inputs.to_string(),
                },
            );
        });
    }

    /// Forget the pods of `nodeset_uid` not in `pods` (UIDs of its current candidates).
    pub fn retain_pods(&self, nodeset_uid: &str, pods: impl IntoIterator<Item = String>) {
        let keep: HashSet<String> = pods.into_iter().collect();
        self.with(|m| {
            if let Some(e) = m.get_mut(nodeset_uid) {
                e.pods.retain(|uid, _| keep.contains(uid));
                if e.pods.is_empty() {
                    m.remove(nodeset_uid);
                }
            }
        });
    }

    /// Forget every NodeSet for which `exists(namespace, name, uid)` is false.
    pub fn retain_nodesets(&self, exists: impl Fn(&str, &str, &str) -> bool) {
        self.with(|m| m.retain(|uid, e| exists(&e.namespace, &e.name, uid)));
    }

    /// Forget `nodeset_uid` (it is being deleted).
    pub fn forget(&self, nodeset_uid: &str) {
        self.with(|m| {
            m.remove(nodeset_uid);
        });
    }

    /// How many pods are remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.with(|m| m.values().map(|e| e.pods.len()).sum())
    }

    /// Whether no pod is remembered.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::reconcile::nodeset::fixtures::nodeset;

    #[test]
    fn a_pod_is_compared_again_only_when_it_or_its_inputs_change() {
        let memo = DifferingPods::default();
        let w = nodeset("w", 3);
        let uid = w.uid().unwrap_or_default();
        let inputs_1 = inputs(&w, "rev1");
        assert!(!memo.differs(&uid, "p0", "10", &inputs_1));
        memo.remember(&w, "p0", "10", &inputs_1);
        assert!(memo.differs(&uid, "p0", "10", &inputs_1));
        assert!(!memo.differs(&uid, "p0", "11", &inputs_1), "the pod changed");
        assert!(
            !memo.differs(&uid, "p0", "10", &inputs(&w, "rev2")),
            "another revision"
        );
        let mut labelled = w.clone();
        labelled.metadata.labels = Some(BTreeMap::from([("site".to_string(), "a".to_string())]));
        assert_ne!(
            inputs(&labelled, "rev1"),
            inputs_1,
            "NodeSet labels reach the pods"
        );
        assert!(!memo.differs("other-uid", "p0", "10", &inputs_1));
    }

    #[test]
    fn gone_pods_and_gone_nodesets_are_forgotten() {
        let memo = DifferingPods::default();
        let w = nodeset("w", 3);
        let uid = w.uid().unwrap_or_default();
        let i = inputs(&w, "rev1");
        for p in ["p0", "p1", "p2"] {
            memo.remember(&w, p, "1", &i);
        }
        assert_eq!(memo.len(), 3);
        memo.retain_pods(&uid, ["p1".to_string()]);
        assert_eq!(memo.len(), 1);
        assert!(memo.differs(&uid, "p1", "1", &i));
        memo.retain_nodesets(|ns, name, u| ns == "slurm" && name == "w" && u == uid);
        assert_eq!(memo.len(), 1, "the NodeSet is still there");
        memo.retain_nodesets(|_, _, u| u != uid);
        assert!(memo.is_empty(), "a NodeSet gone from the cache is dropped whole");
        memo.remember(&w, "p0", "1", &i);
        memo.retain_pods(&uid, []);
        assert!(memo.is_empty());
        memo.remember(&w, "p0", "1", &i);
        memo.forget(&uid);
        assert!(memo.is_empty());
    }
}
