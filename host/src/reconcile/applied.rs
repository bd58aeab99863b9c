//! What the host last applied to each child, so a child no one changed since is not compared
//! again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use crate::plugins::ChildKind;

/// `(kind, namespace, name)` of a child.
pub(crate) type ChildKey = (ChildKind, String, String);

/// What the host last applied to each child: the applied hash, and the resourceVersion the apply
/// left. While the live object still has that resourceVersion, it is what that apply made.
#[derive(Debug, Default)]
pub struct AppliedVersions {
    versions: Mutex<HashMap<ChildKey, (String, String)>>,
}

impl AppliedVersions {
    /// Whether the child `key` was last applied as `hash` and left `resource_version`.
    pub(crate) fn matches(&self, key: &ChildKey, hash: &str, resource_version: &str) -> bool {
        self.versions
            .lock()
            .map(|m| {
                m.get(key)
                    .is_some_and(|(h, rv)| h == hash && rv == resource_version)
            })
            .unwrap_or(false)
    }

    /// Remember that applying `hash` to `key` left `resource_version`.
    pub(crate) fn set(&self, key: ChildKey, hash: String, resource_version: String) {
        if let Ok(mut m) = self.versions.lock() {
            m.insert(key, (hash, resource_version));
        }
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
