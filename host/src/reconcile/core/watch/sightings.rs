//! Pod sightings lower the NodeSet expectations: at once from the watch, and a relist's only
//! when the relist completes (when the reflector swaps the new list into its store).

use std::{
    collections::{HashMap, HashSet},
    time::Instant,
};

use k8s_openapi::api::core::v1::Pod;
use kube::{ResourceExt, runtime::watcher};
use slinky_api::owners::controller_uid;

use crate::reconcile::core::expectations::{Expectations, Relist};

/// A pod as the expectations see it.
struct Sighting {
    owner: Option<String>,
    name: String,
    uid: Option<String>,
    terminating: bool,
}

impl Sighting {
    fn of(pod: &Pod) -> Self {
        Sighting {
            owner: controller_uid(pod.owner_references(), "NodeSet").map(str::to_string),
            name: pod.name_any(),
            uid: pod.uid(),
            terminating: pod.metadata.deletion_timestamp.is_some(),
        }
    }

    fn observe(&self, expectations: &Expectations, deleted: bool) {
        let Some(owner) = &self.owner else { return };
        expectations.creation_observed(owner, &self.name);
        if let (true, Some(uid)) = (deleted || self.terminating, &self.uid) {
            expectations.deletion_observed(owner, uid);
        }
    }
}

/// Lowers expectations from the pod watch, deferring a relist's sightings to its end.
#[derive(Default)]
pub(super) struct PodObserver {
    relist: Option<(Instant, Vec<Sighting>)>,
}

impl PodObserver {
    pub(super) fn observe(&mut self, expectations: &Expectations, ev: &watcher::Event<Pod>) {
        match ev {
            watcher::Event::Apply(pod) => Sighting::of(pod).observe(expectations, false),
            watcher::Event::Delete(pod) => Sighting::of(pod).observe(expectations, true),
            watcher::Event::Init => self.relist = Some((Instant::now(), Vec::new())),
            watcher::Event::InitApply(pod) => {
                if let Some((_, seen)) = self.relist.as_mut() {
                    seen.push(Sighting::of(pod));
                }
            }
            watcher::Event::InitDone => {
                let Some((started, seen)) = self.relist.take() else {
                    return;
                };
                let mut relist = Relist {
                    started: Some(started),
                    names: HashMap::new(),
                    uids: HashSet::new(),
                };
                for s in &seen {
                    s.observe(expectations, false);
                    if let Some(owner) = &s.owner {
                        relist
                            .names
                            .entry(owner.clone())
                            .or_default()
                            .insert(s.name.clone());
                    }
                    relist.uids.extend(s.uid.clone());
                }
                expectations.relisted(&relist);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(name: &str, owner: &str) -> Result<Pod, serde_json::Error> {
        serde_json::from_value(json!({"metadata": {"name": name, "uid": format!("uid-{name}"),
            "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": "w", "uid": owner, "controller": true}]}}))
    }

    #[test]
    fn a_relist_shows_its_pods_to_the_expectations_only_when_it_completes() -> Result<(), serde_json::Error> {
        let expectations = Expectations::new();
        let mut observer = PodObserver::default();
        expectations.expect_creations("ns-uid", ["w-0".to_string()]);
        expectations.creation_succeeded("ns-uid", "w-0");
        observer.observe(&expectations, &watcher::Event::Init);
        observer.observe(&expectations, &watcher::Event::InitApply(pod("w-0", "ns-uid")?));
        // The store still holds the previous list until the relist completes: a pass that
        // found its expectations satisfied now would read a cache without w-0.
        assert!(!expectations.satisfied("ns-uid"), "seen before the store has it");
        observer.observe(&expectations, &watcher::Event::InitDone);
        assert!(expectations.satisfied("ns-uid"));
        Ok(())
    }
}
