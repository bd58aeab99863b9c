//! What the host last applied to each child, so a child no one changed since is not compared
//! again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use crate::plugins::ChildKind;

/// `(kind, namespace, name)` of a child.
pub(crate) type ChildKey = (ChildKind, String, String);

/// What the host last applied to each child: the applied hash, the resourceVersion the apply
/// left, and the fields of the build the API server did not store (a native sidecar's
/// `restartPolicy` on Kubernetes 1.28). While the live object still has that resourceVersion, it
/// is what that apply made; after another writer's change (a StatefulSet's status), lacking only
/// those fields is still no reason to apply.
#[derive(Debug, Default)]
pub struct AppliedVersions {
    versions: Mutex<HashMap<ChildKey, Applied>>,
}

/// One child's last apply: the applied hash, the resourceVersion it left, the fields dropped.
type Applied = (String, String, Vec<String>);

impl AppliedVersions {
    /// Whether the child `key` was last applied as `hash` and left `resource_version`.
    pub(crate) fn matches(&self, key: &ChildKey, hash: &str, resource_version: &str) -> bool {
        self.versions
            .lock()
            .map(|m| {
                m.get(key)
                    .is_some_and(|(h, rv, _)| h == hash && rv == resource_version)
            })
            .unwrap_or(false)
    }

    /// Remember that applying `hash` to `key` left `resource_version`, without the fields
    /// `dropped` (paths, as [`super::compare::differences`] names them).
    pub(crate) fn set(&self, key: ChildKey, hash: String, resource_version: String, dropped: Vec<String>) {
        if let Ok(mut m) = self.versions.lock() {
            m.insert(key, (hash, resource_version, dropped));
        }
    }

    /// Whether `missing` (the fields of `hash`'s build the live object lacks) are all fields the
    /// API server dropped when `hash` was applied to `key`.
    pub(crate) fn only_dropped(&self, key: &ChildKey, hash: &str, missing: &[String]) -> bool {
        !missing.is_empty()
            && self
                .versions
                .lock()
                .map(|m| {
                    m.get(key).is_some_and(|(h, _, dropped)| {
                        h == hash && missing.iter().all(|p| dropped.contains(p))
                    })
                })
                .unwrap_or(false)
    }

    /// Forget `key` (deleted).
    pub(crate) fn forget(&self, key: &ChildKey) {
        if let Ok(mut m) = self.versions.lock() {
            m.remove(key);
        }
    }
}

/// A shared memo of what was applied, for the reconcilers' contexts.
pub fn applied_versions() -> Arc<AppliedVersions> {
    Arc::new(AppliedVersions::default())
}
