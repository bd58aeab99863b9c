//! The pods each NodeSet may concern, by name, so that a pass reads its own pods instead of every
//! pod of the cluster: with 100 NodeSets of 100 pods, each of ~2,000 passes of a scale-up scanned
//! all 10,000 (most of the host's CPU).
//!
//! A pod is indexed under every NodeSet it could concern ([`keys`]): the one that controls it,
//! and each name its own name starts with followed by `-` (`a-b-3` under `a` and `a-b`: the
//! NodeSets whose ordinal or DaemonSet-mode names it could carry). The pass still classifies what
//! it gets ([`crate::reconcile::nodeset::classify::classify`]), so an entry that is no longer right costs a
//! lookup, never a wrong claim.
//!
//! The pod watch updates the index after the store applied the event and before the event lowers
//! the expectations (see `watch::triggers::pod_task`): a pass that finds its expectations
//! satisfied finds every pod they waited for here. A relist rebuilds it from the store.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, PoisonError, RwLock, RwLockWriteGuard},
};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};

/// (namespace, NodeSet name) → the names of the pods it may concern.
type Entries = HashMap<(String, String), HashSet<String>>;

/// The index (see the module).
#[derive(Clone, Default)]
pub struct PodIndex(Arc<RwLock<Entries>>);

/// The (namespace, NodeSet name) keys `pod` is indexed under.
fn keys(pod: &Pod) -> Vec<(String, String)> {
    let (Some(ns), Some(name)) = (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref()) else {
        return Vec::new();
    };
    let mut keys: Vec<(String, String)> = name
        .match_indices('-')
        .map(|(i, _)| (ns.to_string(), name[..i].to_string()))
        .collect();
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "NodeSet");
    if let Some(o) = owner
        && !keys.iter().any(|(_, n)| *n == o.name)
    {
        keys.push((ns.to_string(), o.name.clone()));
    }
    keys
}

impl PodIndex {
    /// The index, to change (a panic elsewhere while it was held leaves it usable: every change
    /// is whole before the guard drops).
    fn write(&self) -> RwLockWriteGuard<'_, Entries> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Index `pod` (added or changed).
    pub fn apply(&self, pod: &Pod) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let keys = keys(pod);
        let mut index = self.write();
        for key in keys {
            index.entry(key).or_default().insert(name.clone());
        }
    }

    /// Forget `pod` (deleted).
    pub fn delete(&self, pod: &Pod) {
        let Some(name) = pod.metadata.name.as_deref() else {
            return;
        };
        let keys = keys(pod);
        let mut index = self.write();
        for key in keys {
            if let Some(names) = index.get_mut(&key) {
                names.remove(name);
                if names.is_empty() {
                    index.remove(&key);
                }
            }
        }
    }

    /// Rebuild from the store (after a relist swapped it in).
    pub fn rebuild(&self, store: &Store<Pod>) {
        let fresh = Self::default();
        for pod in store.state() {
            fresh.apply(&pod);
        }
        let fresh = std::mem::take(&mut *fresh.write());
        *self.write() = fresh;
    }

    /// The cached pods of namespace `ns` that NodeSet `nodeset` may concern.
    pub fn pods(&self, store: &Store<Pod>, ns: &str, nodeset: &str) -> Vec<Arc<Pod>> {
        let names: Vec<String> = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(ns.to_string(), nodeset.to_string()))
            .map(|n| n.iter().cloned().collect())
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| store.get(&ObjectRef::new(name).within(ns)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, owner: Option<&str>) -> Pod {
        let mut value = serde_json::json!({"metadata": {"namespace": ns, "name": name}});
        if let Some(o) = owner {
            value["metadata"]["ownerReferences"] = serde_json::json!([{"apiVersion": "slinky.slurm.net/v1beta1",
                "kind": "NodeSet", "name": o, "uid": "u", "controller": true}]);
        }
        serde_json::from_value(value).unwrap_or_default()
    }

    #[test]
    fn a_pod_is_indexed_under_every_nodeset_it_could_concern() {
        let index = PodIndex::default();
        let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
        let pods = [
            pod("s", "a-b-3", None),
            pod("s", "a-0", Some("a")),
            pod("s", "x-0", Some("renamed")),
            pod("t", "a-1", None),
        ];
        for p in &pods {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(p.clone()));
            index.apply(p);
        }
        let names = |ns: &str, n: &str| {
            let mut v: Vec<String> = index
                .pods(&store, ns, n)
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names("s", "a"), ["a-0", "a-b-3"]);
        assert_eq!(names("s", "a-b"), ["a-b-3"]);
        assert_eq!(names("s", "renamed"), ["x-0"]);
        assert_eq!(names("s", "x"), ["x-0"]);
        assert_eq!(names("t", "a"), ["a-1"]);
        assert!(names("s", "b").is_empty());
        index.delete(&pods[1]);
        assert_eq!(names("s", "a"), ["a-b-3"]);
        // A rebuild keeps what the store has (a-0 is still in it).
        index.rebuild(&store);
        assert_eq!(names("s", "a"), ["a-0", "a-b-3"]);
    }
}
